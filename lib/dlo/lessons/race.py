"""The CIFAR-10 race: wall-clock time to a target test accuracy, with a leaderboard.

A *recipe* (:class:`Recipe`) is everything that decides how fast a model learns: the network and its
width, the batch size, the optimizer, its schedule and learning rate, label smoothing, mixed precision,
memory layout, compilation, and how the data reaches the model. :func:`run_race` trains with it for the
recipe's ``epochs``, then evaluates the test set **once**: the attempt reaches the target when that one
accuracy does, and its time is everything the clock counted.

Why not stop as soon as the test accuracy reaches the target (DAWNBench's rule)? Because then the test set
decides when to stop: a run is measured after every epoch and kept at the first lucky evaluation, so the
accuracy it reports is the maximum of noisy readings, biased upwards, and the test set is no longer a fair
judge. airbench's rule, used here (:data:`RACE_RULE`): the number of epochs is part of the recipe, fixed
before the run, and the test set is read once, at the end. The number of epochs is chosen on a
**validation split** of the training set: :func:`validation_run` holds out training images, trains on the
rest, evaluates the held-out images after every epoch and never reads the test file.

The rules of the clock (also stored in every record, see :data:`TIMING_RULES`):

* **Data loading counts.** The clock starts before the dataset is read from disk. With
  ``data="preload"`` the whole dataset is read, normalised and copied to the device once (counted), then
  augmented there batch by batch (random crop + horizontal flip on the device); with ``data="loader"``
  a ``torch.utils.data.DataLoader`` with torchvision transforms feeds every batch (counted, of course).
* **The one evaluation counts**: ``eval_s`` in the record says how much of the total it was.
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

from dlo.measure.records import environment_info, save_json
from dlo.runtime.device import synchronize
from dlo.training.optim import make_optimizer
from dlo.training.step import amp_dtype, make_grad_scaler, make_train_step, prepare_model
from dlo.training.callbacks import Callback
from dlo.training.evaluate import evaluate
from dlo.training.loop import train
from dlo.lessons.leaderboard import append_to_leaderboard, attempt_fields, standing
from dlo.lessons.leaderboard import check_target, check_writable
from dlo.data.loaders import Batches
from dlo.data.cifar import find_cifar10
from dlo.runtime.device import pick_device
from dlo.runtime.arguments import ScriptParser, at_least, device_name, positive_number
# the lesson's entry point: the recipes and the data helpers are reachable from here (race.Recipe, ...)
from dlo.lessons.race_recipe import (MODELS, RACE_RULE, REAL_TARGET, RECIPES, SMOKE_DATA, SMOKE_TARGET,  # noqa: F401
                                     TIMING_RULES, Recipe, reference_recipe, smoke_recipe)
from dlo.runtime.validate import is_int
from dlo.lessons.race_data import (_test_batches, _train_batches, load_race_data, random_crop_flip,  # noqa: F401
                                   require_data)


def time_to_target(times: Sequence[float], accuracies: Sequence[float], target: float) -> float | None:
    """The first time at which the accuracy reached ``target`` (``>=``), or None if it never did.

    ``times[i]`` is when ``accuracies[i]`` was known (clock time after the i-th evaluation of a
    :func:`validation_run`). Not the time of the best accuracy, and not an interpolation between
    evaluations: the target is reached when a measurement *shows* it, and a curve may go down again.
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


def _count_eval(data_dir, generated, n_test, validation) -> int:
    """The number of images the attempt will evaluate (needed before the clock for the warm-up shapes)."""
    if validation is not None:
        return validation
    if n_test is not None:
        return n_test
    if generated is None:
        generated = find_cifar10(data_dir) is None
    return SMOKE_DATA["n_test"] if generated else 10000


class _Clock(Callback):
    """Stamps each epoch's record with ``time_s`` (seconds on the race clock) and stops after the epoch that
    passes ``time_budget_s``. It never reads an accuracy: nothing that sees the test set decides anything."""

    def __init__(self, start: float, time_budget_s: float | None) -> None:
        self.start, self.time_budget_s, self.stopped_by = start, time_budget_s, None

    def on_epoch_end(self, state, record: dict) -> bool:
        record["time_s"] = time.perf_counter() - self.start
        if self.time_budget_s is not None and record["time_s"] > self.time_budget_s:
            self.stopped_by = "time_budget"
            return True
        return False


def _check_args(recipe, target, time_budget_s) -> float:
    if not isinstance(recipe, Recipe):
        raise TypeError(f"recipe must be a dlo.lessons.race.Recipe, got {type(recipe).__name__}")
    target = check_target(target)
    if time_budget_s is not None and not (isinstance(time_budget_s, (int, float)) and time_budget_s > 0):
        raise ValueError(f"time_budget_s must be a number of seconds > 0 (or None), got {time_budget_s!r}")
    return target


def _train(recipe: Recipe, *, data_dir, generated, device, time_budget_s, n_train, n_test, validation, progress,
           verbose) -> dict[str, Any]:
    """Load, build, train: the part of an attempt both rules share. With ``validation``, the held-out images
    are evaluated after every epoch (``curve[i]["accuracy"]``); without it nothing is evaluated during
    training, and the caller evaluates ``evaluate_batches`` (the test set) once."""
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
        _warm_up(model, recipe, device, dtype, _count_eval(data_dir, generated, n_test, validation))
        compile_s = time.perf_counter() - t_c

    # ---- the clock starts ----
    synchronize(device)
    t0 = time.perf_counter()
    d = load_race_data(recipe, device, data_dir=data_dir, generated=generated, n_train=n_train, n_test=n_test,
                       validation=validation, verbose=verbose)
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

    eval_batches = Batches(lambda: _test_batches(d, recipe), -(-d.n_test // recipe.eval_batch_size))
    clock = _Clock(t0, time_budget_s)
    synchronize(device)
    load_s = time.perf_counter() - t0
    # compile=False: the model is compiled already (above, as the recipe asks); one loss read per epoch
    cfg = recipe.train_config(compile=False, progress=progress, log_every=recipe.epochs * steps_per_epoch + 1,
                              eval_every_epoch=validation is not None, ckpt_path=None, resume=False, tracking_dir=None)
    result = train(model, make_loader, cfg, device, val_loader=eval_batches if validation is not None else None,
                   callbacks=[clock])
    epochs = [r for r in result.records if r["event"] == "epoch"]
    curve = [{"epoch": r["epoch"] + 1, "time_s": r["time_s"], "train_loss": r.get("train_loss", float("nan"))}
             | ({"accuracy": r["val_accuracy"], "loss": r["val_loss"]} if "val_accuracy" in r else {})
             for r in epochs]
    env = environment_info(device)
    return {"t0": t0, "device": device, "dtype": dtype, "data": d, "eval_batches": eval_batches,
            "model": result.ema_model.module if result.ema_model is not None else model,
            "record": {
                "name": recipe.name, "epochs": recipe.epochs, "epochs_run": len(curve),
                "stopped_by": clock.stopped_by or "epochs", "load_s": load_s,
                "train_s": sum(r["seconds"] for r in epochs), "compile_excluded": recipe.exclude_compile,
                "compile_s": compile_s, "data": "generated" if d.is_generated else "real CIFAR-10", "source": d.source,
                "n_train": d.n_train, "steps_per_epoch": steps_per_epoch, "device": str(device),
                **attempt_fields(env), "recipe": recipe.to_dict(), "curve": curve, "env": env}}


def run_race(recipe: Recipe, target: float, *, data_dir=None, generated: bool | None = False,
             device: torch.device | str | None = None, time_budget_s: float | None = None,
             n_train: int | None = None, n_test: int | None = None,
             leaderboard: str | os.PathLike | None = None, progress: bool = True,
             verbose: bool = True) -> dict[str, Any]:
    """One attempt under :data:`RACE_RULE`: train with ``recipe`` for its ``epochs`` (the package's one loop,
    :func:`dlo.training.loop.train`), evaluating nothing on the way, then evaluate the test set once. The
    attempt reaches ``target`` when that accuracy does (``>=``); its time is the whole clock.
    ``time_budget_s`` ends a run that is too slow after the epoch that passes it (the test set is then
    evaluated once, as always, and the record says ``stopped_by="time_budget"``). ``generated``,
    ``data_dir``, ``n_train``, ``n_test``: see :func:`load_race_data`. ``leaderboard``: a JSON file the
    attempt is appended to (checked writable *before* the race).

    Returns a JSON-able record: ``accuracy`` and ``test_loss`` (the one evaluation), ``reached``,
    ``time_to_target_s`` (the total when reached, else None), ``epochs`` / ``epochs_run``, ``stopped_by``
    ("epochs" or "time_budget"), ``curve`` (one point per epoch: ``time_s`` on the race clock and the mean
    ``train_loss``; no accuracy: the test set is not read during training), ``load_s``, ``train_s``,
    ``eval_s``, ``total_s``, ``compile_s`` (the excluded warm-up, or None), ``time_to_target_with_compile_s``,
    the recipe, the data's ``source``, the environment, ``rule``; and what the leaderboard needs to rank it
    only against comparable attempts: ``n_test``, ``data`` ("real CIFAR-10" or "generated"), ``hardware`` and
    ``versions``. An attempt on fewer than the 10 000 real test images or on generated data is a *practice*
    attempt, never on the official board (see :mod:`dlo.lessons.leaderboard`).
    """
    target = _check_args(recipe, target, time_budget_s)
    board = check_writable(leaderboard) if leaderboard is not None else None
    run = _train(recipe, data_dir=data_dir, generated=generated, device=device, time_budget_s=time_budget_s,
                 n_train=n_train, n_test=n_test, validation=None, progress=progress, verbose=verbose)
    device, d = run["device"], run["data"]
    t_eval = time.perf_counter()
    metrics = evaluate(run["model"], run["eval_batches"], device, run["dtype"], recipe.channels_last, tta=recipe.tta)
    synchronize(device)
    end = time.perf_counter()
    total_s = end - run["t0"]
    reached = metrics["accuracy"] >= target
    compile_s = run["record"]["compile_s"]
    record: dict[str, Any] = {
        "name": recipe.name, "rule": RACE_RULE, "target": target, "reached": reached,
        "time_to_target_s": total_s if reached else None, "accuracy": metrics["accuracy"],
        "test_loss": metrics["loss"], "total_s": total_s, "eval_s": end - t_eval,
        "time_to_target_with_compile_s": (total_s + compile_s if compile_s is not None else total_s) if reached else None,
        "n_test": d.n_test, **run["record"], "rules": TIMING_RULES,
    }
    # airbench94's clock: started once the data is loaded (what the course's end-to-end clock counts first)
    record["time_after_loading_s"] = total_s - record["load_s"] if reached else None
    if verbose:
        print(summary_line(record), flush=True)
    if board is not None:
        append_to_leaderboard(record, board)
    return record


def validation_run(recipe: Recipe, target: float, validation: int, *, data_dir=None, generated: bool | None = False,
                   device: torch.device | str | None = None, time_budget_s: float | None = None,
                   n_train: int | None = None, progress: bool = True, verbose: bool = True) -> dict[str, Any]:
    """Where a recipe's choices (its number of epochs first) are made: hold out the last ``validation``
    training images, train on the others with ``recipe`` for its epochs, evaluate the held-out images after
    every epoch. **The test file is never read**, and nothing is put on a leaderboard.

    Returns a record with ``split="validation"``, ``n_val``, ``n_train`` (images trained on), ``curve`` (per
    epoch: ``time_s`` on the clock, which here includes the validation evaluations, ``accuracy`` and ``loss``
    on the held-out images, ``train_loss``), ``val_time_to_target_s`` and ``val_epochs_to_target`` (the first
    evaluation at ``>= target``, :func:`time_to_target`; None if none), ``best_accuracy`` and
    ``final_accuracy``. The first epoch whose accuracy reaches the target is a lower bound for the race's
    ``epochs``: a shorter schedule anneals sooner, so check the choice with another validation run.
    """
    target = _check_args(recipe, target, time_budget_s)
    if not is_int(validation) or validation < 10:
        raise ValueError(f"validation must be the number of training images to hold out, an integer >= 10, "
                         f"got {validation!r}")
    run = _train(recipe, data_dir=data_dir, generated=generated, device=device, time_budget_s=time_budget_s,
                 n_train=n_train, n_test=None, validation=validation, progress=progress, verbose=verbose)
    rec = run["record"]
    curve = rec["curve"]
    reached_at = time_to_target([p["time_s"] for p in curve], [p["accuracy"] for p in curve], target)
    first = next((p["epoch"] for p in curve if p["accuracy"] >= target), None)
    record = {**rec, "split": "validation", "target": target, "n_val": validation,
              "val_time_to_target_s": reached_at, "val_epochs_to_target": first,
              "best_accuracy": max(p["accuracy"] for p in curve), "final_accuracy": curve[-1]["accuracy"],
              "total_s": curve[-1]["time_s"]}
    if verbose:
        where = f"{validation} held-out training images, trained on {rec['n_train']}; the test set was not read"
        if first is not None:
            print(f"{recipe.name}: validation accuracy reached {target:.1%} after epoch {first} of {recipe.epochs} "
                  f"({reached_at:.2f} s; final {record['final_accuracy']:.1%}; {where})", flush=True)
        else:
            print(f"{recipe.name}: validation accuracy did NOT reach {target:.1%} in {rec['epochs_run']} epochs "
                  f"(best {record['best_accuracy']:.1%}; {where})", flush=True)
    return record


def repeated_times(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Time to target over repeated attempts of one recipe, on both clocks: the course's end-to-end one
    (``time_to_target_s``: loading included) and airbench94's (``time_after_loading_s``: the clock starts once the
    data is loaded); for each, the mean and the standard deviation over the attempts that reached the target (as
    airbench94 reports a mean over its runs), and a sentence written from them. One attempt has no spread: the
    sentence says so instead of giving one."""
    reached = [r for r in records if r.get("reached")]
    out: dict[str, Any] = {"attempts": len(records), "reached": len(reached)}
    for key in ("time_to_target_s", "time_after_loading_s"):
        values = [r[key] for r in reached if r.get(key) is not None]
        out[key] = {"mean": statistics.fmean(values) if values else None,
                    "std": statistics.stdev(values) if len(values) > 1 else None, "n": len(values)}
    out["sentence"] = _repeated_sentence(out)
    return out


def _repeated_sentence(summary: dict[str, Any]) -> str:
    n, k = summary["attempts"], summary["reached"]
    if not k:
        return f"none of the {n} attempt(s) reached the target: no time to target"
    e2e, after = summary["time_to_target_s"], summary["time_after_loading_s"]

    def fmt(x: dict[str, Any]) -> str:
        return f"{x['mean']:.2f} s" + (f" ± {x['std']:.2f} s (standard deviation)" if x["std"] is not None else "")

    spread = "" if k > 1 else " (one attempt: no spread, so no difference with another recipe can be claimed from it)"
    return (f"time to target over the {k} of {n} attempt(s) that reached it: {fmt(e2e)} end to end (loading "
            f"included, this course's clock), {fmt(after)} from the end of loading (airbench94's clock){spread}")


def summary_line(record: dict[str, Any]) -> str:
    """One line saying how an attempt went, and on which board it counts."""
    where = f"{record['data']}, {record.get('n_test', '?')} test images, {record.get('hardware') or record['device']}"
    epochs = f"{record['epochs_run']} of {record['epochs']} epochs" if record["stopped_by"] == "time_budget" else \
        f"{record['epochs_run']} epochs"
    if record["reached"]:
        line = (f"{record['name']}: {record['target']:.1%} reached in {record['time_to_target_s']:.2f} s "
                f"(test accuracy {record['accuracy']:.1%} after {epochs}; {where})")
    else:
        line = (f"{record['name']}: {record['target']:.1%} NOT reached: test accuracy {record['accuracy']:.1%} "
                f"after {epochs}, {record['total_s']:.2f} s"
                + (" (stopped by the time budget)" if record["stopped_by"] == "time_budget" else "") + f"; {where}")
    if record.get("compile_s") is not None:
        line += f"; compile warm-up {record['compile_s']:.1f} s excluded"
    board, why = standing(record)
    return line + ("; official board" if board == "official" else f"; {board} board ({why})")


# --------------------------------------------------------------------------------------------------
# Command line: python -m dlo race
# --------------------------------------------------------------------------------------------------

def _fraction(text: str) -> float:
    """``type=`` of ``--target``: an accuracy in (0, 1]."""
    try:
        return check_target(float(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc) if "target" in str(exc) else f"must be a number, got {text!r}"
                                         ) from None


def _parser() -> ScriptParser:
    p = ScriptParser(prog="python -m dlo race",
                     description="One attempt at the CIFAR-10 race: time to a target test accuracy.")
    p.add_argument("--recipe", default="reference", choices=sorted(RECIPES), help="a named recipe (default: reference)")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="change a recipe field, e.g. --set epochs=16 --set amp=none (repeatable)")
    p.add_argument("--target", type=_fraction, default=None,
                   help=f"test accuracy to reach, in (0, 1] (default: {REAL_TARGET} on CIFAR-10, {SMOKE_TARGET} with --generated)")
    p.add_argument("--data-dir", default=None, help="folder holding cifar-10-batches-py (or set DLO_DATA_DIR)")
    p.add_argument("--generated", action="store_true",
                   help="race on generated data (the smoke race; NOT CIFAR-10, use a target such as "
                        f"{SMOKE_TARGET})")
    p.add_argument("--n-train", type=at_least(1), default=None, help="training images (default: all, or the smoke size)")
    p.add_argument("--n-test", type=at_least(1), default=None,
                   help="test images (default: all, or the smoke size); fewer than the 10 000 of real CIFAR-10 make a "
                        "practice attempt, ranked apart from the official board")
    p.add_argument("--device", type=device_name, default=None, help="auto (default), cpu or cuda")
    p.add_argument("--validation", type=at_least(10), default=None, metavar="N",
                   help="a validation run instead of a race: hold out N training images, evaluate them after every "
                        "epoch (to choose the recipe's epochs); the test set is not read, nothing goes on a leaderboard")
    p.add_argument("--time-budget", type=positive_number, default=None, help="stop after the epoch that passes this many seconds")
    p.add_argument("--repeats", type=at_least(1), default=1, help="attempts with seeds seed, seed+1, ...")
    p.add_argument("--out", default=None, help="write the records (with environment) to this JSON file")
    p.add_argument("--leaderboard", default=None, help="append the attempts to this JSON leaderboard")
    p.add_argument("--no-progress", action="store_true")
    return p


def _options(argv: list[str] | None) -> tuple[argparse.Namespace, Recipe]:
    """The options and the recipe they make, checked together: a mistake is one line and SystemExit(2)."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        recipe = recipe_with(args.recipe, args.set)
    except (ValueError, TypeError) as exc:
        parser.refuse(ValueError(f"argument --set: {exc}"))
    if args.validation is not None and (args.n_test is not None or args.leaderboard is not None):
        parser.refuse(ValueError("--validation never reads the test set and puts nothing on a leaderboard: "
                                 "drop --n-test / --leaderboard"))
    if args.target is None:
        args.target = SMOKE_TARGET if args.generated else REAL_TARGET
    return args, recipe


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
    """``dlo race``: 0 when every attempt reached the target, 1 when one did not, 2 (after one line on stderr) for a
    bad option or anything refused before the race starts."""
    try:
        args, recipe = _options(argv)
    except SystemExit as exc:  # --help (0), or a refused option: its one line is written
        return int(exc.code or 0)
    try:
        common = dict(data_dir=args.data_dir, generated=True if args.generated else False, device=args.device,
                      time_budget_s=args.time_budget, n_train=args.n_train, progress=not args.no_progress)
        records = []
        for k in range(args.repeats):
            r = recipe.replace(seed=recipe.seed + k) if k else recipe
            if args.validation is not None:
                records.append(validation_run(r, args.target, args.validation, **common))
            else:
                records.append(run_race(r, args.target, n_test=args.n_test, leaderboard=args.leaderboard, **common))
    except (ValueError, TypeError, FileNotFoundError, PermissionError, IsADirectoryError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.validation is not None:
        if args.out:
            save_json({"target": args.target, "recipe": recipe.to_dict(), "split": "validation",
                       "env": records[0]["env"], "records": records}, args.out)
            print(f"wrote {args.out}")
        return 0 if all(r["val_epochs_to_target"] is not None for r in records) else 1
    if args.out:
        times = [r["time_to_target_s"] for r in records if r["reached"]]
        save_json({"target": args.target, "recipe": recipe.to_dict(), "attempts": len(records),
                   "reached": len(times), "median_time_to_target_s": statistics.median(times) if times else None,
                   "env": records[0]["env"], "records": records}, args.out)
        print(f"wrote {args.out}")
    return 0 if all(r["reached"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
