"""The CIFAR-10 race: wall-clock time to a target test accuracy, with a leaderboard.

A *recipe* (:class:`Recipe`) is everything that decides how fast a model learns: the network and its
width, the batch size, the optimizer, its schedule and learning rate, label smoothing, mixed precision,
memory layout, compilation, and how the data reaches the model. :func:`run_race` trains with it epoch by
epoch, measures the test accuracy after every epoch, and stops as soon as the target is reached.

The rules of the clock (also stored in every record, see :data:`TIMING_RULES`):

* **Data loading counts.** The clock starts before the dataset is read from disk. With
  ``data="preload"`` the whole dataset is read, normalised and copied to the device once (counted), then
  augmented there batch by batch (random crop + horizontal flip on the device); with ``data="loader"``
  a ``torch.utils.data.DataLoader`` with torchvision transforms feeds every batch (counted, of course).
* **Evaluation counts.** The race needs the test accuracy after each epoch to know when to stop, so that
  time is on the clock (airbench only counts its final evaluation, since it trains for a fixed number of
  epochs; here the stopping rule is part of the race). ``eval_s`` in the record says how much of the
  total it was.
* **Compilation counts, unless the recipe says** ``exclude_compile=True``: then the model is compiled
  and warmed up (a few steps on random data, in training and evaluation mode, after which the weights
  and the optimizer are restored) *before* the clock starts; that warm-up is timed on its own and
  reported as ``compile_s``, next to ``time_to_target_s`` (without it) and
  ``time_to_target_with_compile_s`` (with it).
* **Device start-up does not count**: the CUDA context is created before the clock starts (a one-off
  cost of the process, not of the recipe).
* Every reading of the clock comes after :func:`dlo.runtime.device.synchronize`: the GPU has finished the work.

Real CIFAR-10 or generated data: the race on real CIFAR-10 (target 94 %, :data:`REAL_TARGET`) needs the
data (``data_dir=``, ``$DLO_DATA_DIR``, ``$DSDIR``, ``<project>/data``); when it is missing the race stops
with one line saying where to put it. Generated CIFAR-format data (see :mod:`dlo.data`) is used only when
asked (``generated=True``, the smoke profile) or allowed as a fallback (``generated=None``), and the record
says so; its accuracies are not CIFAR-10 accuracies, so its race has its own target
(:data:`SMOKE_TARGET`).

``python -m dlo race --recipe reference --target 0.94 --data-dir DIR`` runs one attempt without Jupyter.
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from typing import Any, Iterable, Sequence

import torch
from torch import nn

from dlo.measure.bench import environment_info, save_json
from dlo.runtime.device import synchronize
from dlo.training.optim import make_optimizer
from dlo.training.step import amp_dtype, make_grad_scaler, make_train_step, prepare_model
from dlo.training.callbacks import Callback, StopAtTarget
from dlo.training.evaluate import evaluate
from dlo.training.loop import train
from dlo.lessons.leaderboard import append_to_leaderboard, attempt_fields, standing
from dlo.lessons.leaderboard import check_target, check_writable
from dlo.data.loaders import Batches
from dlo.data.cifar import find_cifar10
from dlo.runtime.device import pick_device
# the lesson's entry point: the recipes and the data helpers are reachable from here (race.Recipe, ...)
from dlo.lessons.race_recipe import (MODELS, REAL_TARGET, RECIPES, SMOKE_DATA, SMOKE_TARGET, TIMING_RULES, Recipe,  # noqa: F401
                                     reference_recipe, smoke_recipe)
from dlo.runtime.validate import is_int
from dlo.lessons.race_data import (_test_batches, _train_batches, load_race_data, random_crop_flip,  # noqa: F401
                                   require_data)


def time_to_target(times: Sequence[float], accuracies: Sequence[float], target: float) -> float | None:
    """The first time at which the accuracy reached ``target`` (``>=``), or None if it never did.

    ``times[i]`` is when ``accuracies[i]`` was known (clock time after the i-th evaluation). Not the time
    of the best accuracy, and not an interpolation between evaluations: the race is won when a
    measurement *shows* the target, and a curve may go down again afterwards.
    """
    target = check_target(target)
    if len(times) != len(accuracies):
        raise ValueError(f"times and accuracies must have the same length, got {len(times)} and {len(accuracies)}")
    for t, acc in zip(times, accuracies):
        if acc >= target:
            return float(t)
    return None


# --------------------------------------------------------------------------------------------------
# The race
# --------------------------------------------------------------------------------------------------

def _build(recipe: Recipe, device: torch.device) -> nn.Module:
    torch.manual_seed(recipe.seed)
    model = MODELS[recipe.model](num_classes=10, width=recipe.width)
    # device, channels_last, cudnn.benchmark (and the one-line refusal of GPU-only options on a CPU)
    model = prepare_model(model, device, channels_last=recipe.channels_last, cudnn_benchmark=recipe.cudnn_benchmark,
                          compile=False, compile_mode=recipe.compile_mode)
    if recipe.compile:
        model = compile_model(model, recipe)
    return model


def compile_model(model: nn.Module, recipe: Recipe) -> nn.Module:
    """``torch.compile`` as the recipe asks (a separate function, so that the tests can time a fake one)."""
    return torch.compile(model, mode=recipe.compile_mode, backend=recipe.compile_backend)


def _warm_up(model: nn.Module, recipe: Recipe, device: torch.device, dtype, n_test: int) -> None:
    """Run the compiled model on random data for every shape the race will use (training batch, evaluation
    batch and the last, smaller, evaluation batch) with a throwaway optimizer, then put the weights back."""
    saved_model = copy.deepcopy(model.state_dict())
    optimizer = make_optimizer(recipe.optimizer, model, lr=recipe.lr, weight_decay=recipe.weight_decay,
                               momentum=recipe.momentum)
    step = make_train_step(model, optimizer, nn.CrossEntropyLoss(label_smoothing=recipe.label_smoothing), device,
                           dtype, make_grad_scaler(device, dtype))
    gen = torch.Generator(device="cpu").manual_seed(12345)
    fmt = torch.channels_last if recipe.channels_last else torch.contiguous_format

    def batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(n, 3, 32, 32, generator=gen).to(device).contiguous(memory_format=fmt)
        return x, torch.randint(0, 10, (n,), generator=gen).to(device)

    for _ in range(2):
        step(*batch(recipe.batch_size))
    sizes = {min(recipe.eval_batch_size, n_test)}
    if n_test % recipe.eval_batch_size and n_test > recipe.eval_batch_size:
        sizes.add(n_test % recipe.eval_batch_size)
    for n in sorted(sizes):
        for _ in range(2):
            evaluate(model, [batch(n)], device, dtype, recipe.channels_last, tta=recipe.tta)
    model.load_state_dict(saved_model)
    synchronize(device)


def _count_test(data_dir, generated, n_test) -> int:
    """The number of test images the race will evaluate on (needed before the clock for the warm-up shapes)."""
    if n_test is not None:
        return n_test
    if generated is None:
        generated = find_cifar10(data_dir) is None
    return SMOKE_DATA["n_test"] if generated else 10000


class _StopAfter(Callback):
    """The race's last epoch when the target is not reached (``max_epochs`` may be less than the schedule)."""

    def __init__(self, max_epochs: int) -> None:
        self.max_epochs = max_epochs

    def on_epoch_end(self, state, record: dict) -> bool:
        return record["epoch"] + 1 >= self.max_epochs


def run_race(recipe: Recipe, target: float, *, data_dir=None, generated: bool | None = False,
             device: torch.device | str | None = None, max_epochs: int | None = None,
             time_budget_s: float | None = None, n_train: int | None = None, n_test: int | None = None,
             leaderboard: str | os.PathLike | None = None, progress: bool = True,
             verbose: bool = True) -> dict[str, Any]:
    """One attempt: train with ``recipe`` (the package's one loop, :func:`dlo.training.loop.train`), evaluate
    after every epoch, stop at ``target`` test accuracy (:class:`dlo.training.callbacks.StopAtTarget`).
    ``max_epochs`` (default ``recipe.epochs``, at most that: the schedule ends there) and ``time_budget_s``
    (stop after the epoch that exceeds it) bound a run that never reaches the target. ``generated``,
    ``data_dir``, ``n_train``, ``n_test``: see :func:`load_race_data`. ``leaderboard``: a JSON file the
    attempt is appended to (checked writable *before* the race).

    Returns a JSON-able record: ``time_to_target_s`` (None if not reached), ``epochs_to_target``,
    ``curve`` (one point per epoch: ``time_s`` on the race clock, test ``accuracy`` and ``loss``, mean
    ``train_loss``), ``load_s``, ``train_s``, ``eval_s``, ``compile_s`` (the excluded warm-up, or None),
    ``time_to_target_with_compile_s``, the recipe, the data's ``source`` and the environment; and what the
    leaderboard needs to rank it only against comparable attempts: ``n_test`` (test images evaluated), ``data``
    ("real CIFAR-10" or "generated"), ``hardware`` (GPU or CPU name) and ``versions`` (torch, ...). An attempt on
    fewer than the 10 000 real test images (``n_test``) or on generated data is a *practice* attempt, never on
    the official board (see :mod:`dlo.lessons.leaderboard`).
    """
    if not isinstance(recipe, Recipe):
        raise TypeError(f"recipe must be a dlo.lessons.race.Recipe, got {type(recipe).__name__}")
    target = check_target(target)
    if max_epochs is None:
        max_epochs = recipe.epochs
    if not is_int(max_epochs) or not 1 <= max_epochs <= recipe.epochs:
        raise ValueError(f"max_epochs must be an integer in [1, recipe.epochs={recipe.epochs}] (the schedule ends "
                         f"after recipe.epochs), got {max_epochs!r}")
    if time_budget_s is not None and not (isinstance(time_budget_s, (int, float)) and time_budget_s > 0):
        raise ValueError(f"time_budget_s must be a number of seconds > 0 (or None), got {time_budget_s!r}")
    board = check_writable(leaderboard) if leaderboard is not None else None
    require_data(data_dir, generated)  # before the compile warm-up: a missing data set is an error now
    device = pick_device(device)
    dtype = amp_dtype(recipe.amp)
    torch.zeros(1, device=device)  # device start-up (CUDA context): before the clock
    synchronize(device)

    compile_s = None
    model = None
    if recipe.exclude_compile:  # compile + warm up off the clock, timed on its own
        t_c = time.perf_counter()
        model = _build(recipe, device)
        _warm_up(model, recipe, device, dtype, _count_test(data_dir, generated, n_test))
        compile_s = time.perf_counter() - t_c

    # ---- the clock starts ----
    synchronize(device)
    t0 = time.perf_counter()
    d = load_race_data(recipe, device, data_dir=data_dir, generated=generated, n_train=n_train, n_test=n_test,
                       verbose=verbose)
    if model is None:
        model = _build(recipe, device)
    steps_per_epoch = (len(d.train_loader) if d.mode == "loader" else d.n_train // recipe.batch_size)
    if recipe.schedule == "onecycle" and recipe.epochs * steps_per_epoch < 3:
        raise ValueError(f"the onecycle schedule needs at least 3 optimizer steps, this recipe makes "
                         f"{recipe.epochs * steps_per_epoch}: more epochs, a smaller batch, or another schedule")

    def make_loader(generator: torch.Generator):
        if d.mode == "loader":
            return d.train_loader
        return Batches(lambda: _train_batches(d, recipe, generator), steps_per_epoch)

    test_batches = Batches(lambda: _test_batches(d, recipe), -(-d.n_test // recipe.eval_batch_size))
    stop = StopAtTarget(target, start=t0, time_budget_s=time_budget_s)
    synchronize(device)
    load_s = time.perf_counter() - t0
    # compile=False: the model is compiled already (above, as the recipe asks); one loss read per epoch
    cfg = recipe.train_config(compile=False, progress=progress, log_every=recipe.epochs * steps_per_epoch + 1,
                              eval_every_epoch=True, ckpt_path=None, resume=False, tracking_dir=None)
    result = train(model, make_loader, cfg, device, val_loader=test_batches, callbacks=[stop, _StopAfter(max_epochs)])
    epochs = [r for r in result.records if r["event"] == "epoch"]
    curve = [{"epoch": r["epoch"] + 1, "time_s": r["time_s"], "accuracy": r["val_accuracy"], "loss": r["val_loss"],
              "train_loss": r.get("train_loss", float("nan"))} for r in epochs]
    train_s = sum(r["seconds"] for r in epochs)
    eval_s = sum(r["eval_seconds"] for r in epochs)
    reached_at = stop.reached["time_s"] if stop.reached is not None else None
    epochs_to_target = stop.reached["epoch"] + 1 if stop.reached is not None else None
    stopped_by = stop.stopped_by or "max_epochs"
    env = environment_info(device)
    record: dict[str, Any] = {
        "name": recipe.name, "target": target, "reached": reached_at is not None,
        "time_to_target_s": reached_at, "epochs_to_target": epochs_to_target, "epochs_run": len(curve),
        "stopped_by": stopped_by, "best_accuracy": max(p["accuracy"] for p in curve),
        "final_accuracy": curve[-1]["accuracy"], "total_s": curve[-1]["time_s"],
        "load_s": load_s, "train_s": train_s, "eval_s": eval_s,
        "compile_excluded": recipe.exclude_compile, "compile_s": compile_s,
        "time_to_target_with_compile_s": (reached_at + compile_s) if (reached_at is not None and compile_s is not None)
        else reached_at,
        "data": "generated" if d.is_generated else "real CIFAR-10", "source": d.source,
        "n_train": d.n_train, "n_test": d.n_test, "steps_per_epoch": steps_per_epoch,
        "device": str(device), **attempt_fields(env), "recipe": recipe.to_dict(), "curve": curve,
        "rules": TIMING_RULES, "env": env,
    }
    if verbose:
        print(summary_line(record), flush=True)
    if board is not None:
        append_to_leaderboard(record, board)
    return record


def summary_line(record: dict[str, Any]) -> str:
    """One line saying how an attempt went, and on which board it counts."""
    where = f"{record['data']}, {record.get('n_test', '?')} test images, {record.get('hardware') or record['device']}"
    if record["reached"]:
        line = (f"{record['name']}: {record['target']:.1%} reached in {record['time_to_target_s']:.2f} s "
                f"({record['epochs_to_target']} epochs; {where})")
    else:
        line = (f"{record['name']}: {record['target']:.1%} NOT reached in {record['epochs_run']} epochs, "
                f"{record['total_s']:.2f} s (best {record['best_accuracy']:.1%}, stopped by {record['stopped_by']}; {where})")
    if record.get("compile_s") is not None:
        line += f"; compile warm-up {record['compile_s']:.1f} s excluded"
    board, why = standing(record)
    return line + ("; official board" if board == "official" else f"; {board} board ({why})")


# --------------------------------------------------------------------------------------------------
# Command line: python -m dlo race
# --------------------------------------------------------------------------------------------------

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dlo race",
                                description="One attempt at the CIFAR-10 race: time to a target test accuracy.")
    p.add_argument("--recipe", default="reference", choices=sorted(RECIPES), help="a named recipe (default: reference)")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="change a recipe field, e.g. --set epochs=16 --set amp=none (repeatable)")
    p.add_argument("--target", type=float, default=None,
                   help=f"test accuracy to reach, in (0, 1] (default: {REAL_TARGET} on CIFAR-10, {SMOKE_TARGET} with --generated)")
    p.add_argument("--data-dir", default=None, help="folder holding cifar-10-batches-py (or set DLO_DATA_DIR)")
    p.add_argument("--generated", action="store_true",
                   help="race on generated data (the smoke race; NOT CIFAR-10, use a target such as "
                        f"{SMOKE_TARGET})")
    p.add_argument("--n-train", type=int, default=None, help="training images (default: all, or the smoke size)")
    p.add_argument("--n-test", type=int, default=None,
                   help="test images (default: all, or the smoke size); fewer than the 10 000 of real CIFAR-10 make a "
                        "practice attempt, ranked apart from the official board")
    p.add_argument("--device", default=None, help="auto (default), cpu or cuda")
    p.add_argument("--max-epochs", type=int, default=None)
    p.add_argument("--time-budget", type=float, default=None, help="stop after the epoch that passes this many seconds")
    p.add_argument("--repeats", type=int, default=1, help="attempts with seeds seed, seed+1, ...")
    p.add_argument("--out", default=None, help="write the records (with environment) to this JSON file")
    p.add_argument("--leaderboard", default=None, help="append the attempts to this JSON leaderboard")
    p.add_argument("--no-progress", action="store_true")
    return p


def _parse_value(text: str) -> Any:
    low = text.strip().lower()
    if low in ("none", "null"):
        return None
    if low in ("true", "false"):
        return low == "true"
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def recipe_with(name: str, settings: Iterable[str]) -> Recipe:
    """A named recipe with ``FIELD=VALUE`` changes (the command line's ``--set``)."""
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}: use one of {', '.join(RECIPES)}")
    changes: dict[str, Any] = {}
    for item in settings:
        if "=" not in item:
            raise ValueError(f"--set expects FIELD=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        changes[key.strip()] = _parse_value(value)
    if changes.get("amp") == "none":
        changes["amp"] = None
    return Recipe.from_dict({**RECIPES[name]().to_dict(), **changes})


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        recipe = recipe_with(args.recipe, args.set)
        if args.repeats < 1:
            raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
        if args.target is None:
            args.target = SMOKE_TARGET if args.generated else REAL_TARGET
        records = []
        for k in range(args.repeats):
            r = recipe.replace(seed=recipe.seed + k) if k else recipe
            records.append(run_race(r, args.target, data_dir=args.data_dir, generated=True if args.generated else False,
                                    device=args.device, max_epochs=args.max_epochs, time_budget_s=args.time_budget,
                                    n_train=args.n_train, n_test=args.n_test, leaderboard=args.leaderboard,
                                    progress=not args.no_progress))
    except (ValueError, TypeError, FileNotFoundError, PermissionError, IsADirectoryError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.out:
        times = [r["time_to_target_s"] for r in records if r["reached"]]
        save_json({"target": args.target, "recipe": recipe.to_dict(), "attempts": len(records),
                   "reached": len(times), "median_time_to_target_s": statistics.median(times) if times else None,
                   "env": records[0]["env"], "records": records}, args.out)
        print(f"wrote {args.out}")
    return 0 if all(r["reached"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
