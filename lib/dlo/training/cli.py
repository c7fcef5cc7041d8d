"""``dlo train``: the training loop from the command line (batch jobs, the kill-and-resume tests).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from dlo.training.config import TrainConfig
from dlo.training.callbacks import Callback
from dlo.training.checkpoint import check_model_shape, read_checkpoint, unwrap_model
from dlo.training.loop import train
from dlo import data
from dlo.measure.records import environment_info, save_json
from dlo.runtime.arguments import ScriptParser, at_least, device_name, positive_number
from dlo.runtime.atomic import atomic_write
from dlo.runtime.device import pick_device
from dlo.runtime.paths import probe_writable
from dlo.models.resnets import resnet18_cifar
from dlo.data.augment import MixCutMix


# --------------------------------------------------------------------------------------------------
# Command line: python -m dlo train
# --------------------------------------------------------------------------------------------------

def _parser() -> ScriptParser:
    p = ScriptParser(prog="python -m dlo train", description="Train the CIFAR ResNet-18 with dlo's loop.")
    p.add_argument("--data-dir", default=None, help="folder holding cifar-10-batches-py (default: look, else generate)")
    p.add_argument("--generated", action="store_true", help="force the generated CIFAR-format dataset")
    p.add_argument("--n-train", type=at_least(1), default=2000, help="generated data: training images")
    p.add_argument("--width", type=at_least(1), default=64, help="ResNet width (64 = standard ResNet-18)")
    p.add_argument("--batch-size", type=at_least(1), default=128)
    p.add_argument("--workers", type=at_least(0), default=0)
    p.add_argument("--epochs", type=at_least(1), default=1)
    p.add_argument("--steps", type=at_least(1), default=None)
    p.add_argument("--lr", type=positive_number, default=0.05)
    p.add_argument("--amp", choices=["bf16", "fp16", "none"], default="none")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--cudnn-benchmark", action="store_true")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--device", type=device_name, default=None, help="auto (default), cpu or cuda")
    p.add_argument("--seed", type=at_least(0), default=0)
    p.add_argument("--ckpt", default=None, help="checkpoint file (saved on SIGTERM/SIGUSR1 and at the end)")
    p.add_argument("--ckpt-every", type=at_least(1), default=None)
    p.add_argument("--resume", action="store_true", help="continue from --ckpt")
    p.add_argument("--out", default=None, help="write the records and final metrics to this JSON file")
    p.add_argument("--save-weights", default=None, help="write the final model state_dict to this file")
    p.add_argument("--log-every", type=at_least(1), default=10)
    p.add_argument("--no-progress", action="store_true")
    r = p.add_argument_group("recipes (all off by default)")
    r.add_argument("--resize-schedule", type=_schedule_arg, default=None, metavar="E:S,...",
                   help="progressive resizing, e.g. 0:16,2:24,4:32 (from epoch E, images resized to SxS)")
    r.add_argument("--batch-schedule", type=_schedule_arg, default=None, metavar="E:B,...",
                   help="dynamic batch size, e.g. 0:64,3:128 (from epoch E, batches of B); overrides --batch-size")
    r.add_argument("--scale-lr", action="store_true", help="with --batch-schedule: lr x batch / first batch")
    r.add_argument("--ema-decay", type=float, default=None, help="EMA of the weights with this decay (e.g. 0.99)")
    r.add_argument("--label-smoothing", type=float, default=0.0)
    r.add_argument("--mixcutmix", action="store_true", help="MixUp / CutMix on each batch (dlo.data.augment.MixCutMix)")
    r.add_argument("--eval", action="store_true", help="evaluate on the test split after each epoch")
    r.add_argument("--tta", action="store_true", help="with --eval: test-time augmentation (image + flip)")
    t = p.add_argument_group("experiment tracking")
    t.add_argument("--tracking-dir", default=None, help="log to TensorBoard + MLflow (file store) under this folder")
    t.add_argument("--run-name", default=None, help="the run's name in the tracking stores")
    return p


def _schedule_arg(text: str) -> list[tuple[int, int]]:
    """'0:16,2:24' -> [(0, 16), (2, 24)] (argparse turns the ValueError into a one-line usage error)."""
    try:
        return [(int(e), int(v)) for e, v in (item.split(":") for item in text.split(","))]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: write EPOCH:VALUE pairs separated by commas, e.g. 0:16,2:24") from None


def main(argv: list[str] | None = None) -> int:
    """``dlo train``: 0 when done, 2 (after one line on stderr) for a bad option or anything refused before the
    run starts, 1 (after one line) when the system stops the run (a full disk while writing a checkpoint: the
    previous one is kept)."""
    parser = _parser()
    try:
        args = parser.parse_args(argv)
        try:
            _check_options(args)
        except ValueError as exc:
            parser.refuse(exc)
    except SystemExit as exc:  # --help (0), or a refused option: its one line is written
        return int(exc.code or 0)
    try:
        return _main(args)
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # during the run: a full disk while checkpointing (the previous checkpoint is kept)
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1


# --------------------------------------------------------------------------------------------------
# Checks made before any work: options, output paths, the checkpoint to resume
# --------------------------------------------------------------------------------------------------

# The options that change what a run computes (its data, model, batches, random numbers, schedule, loss):
# a resume with other values would not continue the same run, so the checkpoint keeps them and they are compared.
TRAJECTORY_OPTIONS = ("data_dir", "generated", "n_train", "width", "batch_size", "workers", "epochs", "steps", "lr",
                      "amp", "seed", "resize_schedule", "batch_schedule", "scale_lr", "ema_decay", "label_smoothing",
                      "mixcutmix")


def _flag(option: str) -> str:
    return "--" + option.replace("_", "-")


def run_options(args: argparse.Namespace) -> dict:
    """The run's :data:`TRAJECTORY_OPTIONS` as plain values (schedules as lists of lists), as kept in a checkpoint."""
    out = {}
    for key in TRAJECTORY_OPTIONS:
        value = getattr(args, key)
        out[key] = [list(pair) for pair in value] if isinstance(value, (list, tuple)) else value
    return out


class RunOptions(Callback):
    """Keeps the run's options (:func:`run_options`) in its checkpoint (a callback's state is checkpointed)
    and refuses, when the loop restores it, a resume whose options differ."""

    KEY = "dlo_train_options"

    def __init__(self, options: dict, ckpt: str | None) -> None:
        self.options, self.ckpt = dict(options), ckpt

    def state_dict(self) -> dict:
        return {self.KEY: dict(self.options)}

    def load_state_dict(self, state: dict) -> None:
        check_same_run(self.ckpt, state.get(self.KEY), self.options)


def saved_options(state: dict) -> dict | None:
    """The options a checkpoint of ``dlo train`` recorded (None if it has none)."""
    stateful = (state.get("extra") or {}).get("stateful") or {}
    for value in stateful.values():
        if isinstance(value, dict) and isinstance(value.get(RunOptions.KEY), dict):
            return value[RunOptions.KEY]
    return None


def check_same_run(ckpt: str | None, saved: dict | None, now: dict) -> None:
    """One line naming every option whose value differs between the checkpoint's run and this one."""
    if saved is None:
        raise ValueError(f"the checkpoint {ckpt} does not record the options of its run (it was not written by "
                         f"`dlo train`), so a resume cannot be checked: train from scratch without --resume")
    missing = object()
    changed = [f"{_flag(k)} {saved.get(k)!r} then, {now[k]!r} now" for k in now if saved.get(k, missing) != now[k]]
    if changed:
        raise ValueError(f"the checkpoint {ckpt} was written by a run with other options ({'; '.join(changed)}): "
                         f"resume with that run's options, or train from scratch without --resume")


def _check_options(args: argparse.Namespace) -> None:
    """Options that do not go together (each number alone is checked by its ``type=``)."""
    if args.ckpt_every is not None and not args.ckpt:
        raise ValueError("--ckpt-every needs --ckpt (the file the checkpoints are written to)")
    if args.resume and not args.ckpt:
        raise ValueError("--resume continues from a checkpoint: give its file with --ckpt PATH")
    if args.tta and not args.eval:
        raise ValueError("--tta changes the evaluation: add --eval")


def _check_output_file(flag: str, value: str) -> None:
    """``value`` can be written: not a folder, not under a regular file, in a folder this user may write."""
    path = Path(value).expanduser()
    if path.is_dir():
        raise ValueError(f"{flag} {value} is a folder: give a file path in it (e.g. {path / 'run.pt'})")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ValueError(f"{flag} {value}: {parent} is a file, not a folder: choose another path")
            break
    try:
        probe_writable(path.parent)  # creates the folder, then writes and removes a probe file
    except OSError as exc:
        raise ValueError(f"{flag} {value}: cannot write in {path.parent} ({exc.strerror or exc}): choose a folder "
                         f"you can write to") from None


def _check_resume(args: argparse.Namespace) -> None:
    """The checkpoint to resume is readable, of this model's shape, and from a run with the same options."""
    state = read_checkpoint(args.ckpt)
    check_model_shape(args.ckpt, resnet18_cifar(width=args.width), state["model"])
    check_same_run(args.ckpt, saved_options(state), run_options(args))


def _main(args: argparse.Namespace) -> int:
    # Everything that can be checked is checked first (the options already are): a mistake costs a line, not minutes
    # of training.
    cfg = TrainConfig(epochs=args.epochs, steps=args.steps, lr=args.lr, amp=None if args.amp == "none" else args.amp,
                      channels_last=args.channels_last, cudnn_benchmark=args.cudnn_benchmark, compile=args.compile,
                      seed=args.seed, ckpt_path=args.ckpt, ckpt_every=args.ckpt_every, resume=args.resume,
                      log_every=args.log_every, progress=not args.no_progress, eval_every_epoch=args.eval,
                      resize_schedule=args.resize_schedule, batch_schedule=args.batch_schedule,
                      scale_lr_with_batch=args.scale_lr, ema_decay=args.ema_decay, tta=args.tta,
                      label_smoothing=args.label_smoothing, tracking_dir=args.tracking_dir, run_name=args.run_name)
    for flag, value in (("--ckpt", args.ckpt), ("--out", args.out), ("--save-weights", args.save_weights)):
        if value:
            _check_output_file(flag, value)
    if args.resume:
        _check_resume(args)
    device = pick_device(args.device)
    generated = True if args.generated else None
    train_set = data.cifar10("train", args.data_dir, data.train_transform(), generated=generated,
                             n_train=args.n_train, seed=args.seed)
    val_loader = None
    if args.eval:
        test_set = data.cifar10("test", args.data_dir, data.test_transform(), generated=generated,
                                n_train=args.n_train, seed=args.seed, verbose=False)
        val_loader = data.make_loader(test_set, 512, shuffle=False, num_workers=args.workers,
                                      pin_memory=device.type == "cuda")
    batch_transform = None
    if args.mixcutmix:

        batch_transform = MixCutMix(num_classes=10, generator=torch.Generator().manual_seed(args.seed))
    torch.manual_seed(args.seed)
    model = resnet18_cifar(width=args.width)

    def make_loader(generator: torch.Generator, batch_size: int | None = None):
        return data.make_loader(train_set, batch_size or args.batch_size, shuffle=True, num_workers=args.workers,
                                drop_last=True, generator=generator, pin_memory=device.type == "cuda")

    def on_step(step: int, loss: float) -> None:
        print(f"step {step} loss {loss:.4f}", flush=True)

    result = train(model, make_loader, cfg, device, val_loader=val_loader, on_step=on_step,
                   batch_transform=batch_transform, track_params={"width": args.width, "dataset": train_set.source},
                   callbacks=[RunOptions(run_options(args), args.ckpt)])
    for r in result.records:
        if r.get("event") == "epoch" and "val_accuracy" in r:
            print(f"epoch {r['epoch']} val_accuracy {r['val_accuracy']:.4f}", flush=True)
    if result.stopped_by and result.checkpoint:
        print(f"stopped by {result.stopped_by} at step {result.step}; checkpoint: {result.checkpoint} "
              f"(rerun with --resume to continue)", flush=True)
    elif result.stopped_by:
        print(f"stopped by {result.stopped_by} at step {result.step}; nothing was saved (no --ckpt), so this run "
              f"cannot be continued: give --ckpt PATH to be able to resume after a stop", flush=True)
    if args.save_weights:
        weights = unwrap_model(result.model).state_dict()
        atomic_write(args.save_weights, lambda tmp: torch.save(weights, tmp))
    if args.out:
        save_json({"env": environment_info(device), "args": vars(args), "dataset": train_set.source,
                   "step": result.step, "stopped_by": result.stopped_by, "records": result.records}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
