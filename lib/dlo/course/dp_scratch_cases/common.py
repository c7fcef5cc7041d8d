"""What every step's case shares: the tolerances (by dtype), the set-ups (seeds, dtypes, a frozen layer, two ways of
dealing the samples, model widths, micro-batches per step, bucket sizes), the model and data, the one-process
reference, and the comparisons that name what differs."""
from __future__ import annotations

import contextlib
import copy
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from dlo.parallel.dp_events import Timeline


TOL = 1e-6  # fp32 gradients and weights: |got - expected| <= TOL + TOL * |expected|
TOLERANCE = {torch.float32: TOL, torch.float64: 1e-9}  # fp64 sums agree to ~1e-15: a float32 detour shows
STEPS = ("naive", "broadcast", "overlap", "buckets", "no_sync")
PER_RANK = 6  # samples per rank in the first set-ups (3 micro-batches of 2 in the no_sync step)
LR = 0.1  # plain SGD: the step's effective gradient is (weights before - weights after) / LR
K = 3  # micro-batches per step in the no_sync step of the first set-ups


class Bad(AssertionError):
    """A wrong answer, said in one line (raised by the cases, turned into CheckFailed by the checkers)."""


def _expect(cond: bool, message: str) -> None:
    if not cond:
        raise Bad(message)


def load_script(path: str | Path) -> dict[str, Any]:
    """The definitions of a course script, executed as a module named ``__exercises__`` (its main does not run),
    as :func:`dlo.course.checks.framework.load_exercises` does."""
    path = Path(path).resolve()
    ns: dict[str, Any] = {"__name__": "__exercises__", "__file__": str(path)}
    exec(compile(path.read_text(), str(path), "exec"), ns)  # noqa: S102 - course code
    return ns


@dataclass(frozen=True)
class Setup:
    seed: int
    dtype: torch.dtype
    frozen: bool  # one hidden layer has requires_grad=False (no .grad, but gradients flow through it)
    interleave: bool  # samples dealt to the ranks in turn (True) or in contiguous slices (False)
    widths: tuple[int, ...] = (3, 7, 5, 4)  # the hidden layers' widths (the third Linear has no bias)
    k: int = K  # micro-batches per step (no_sync)
    per_rank: int = PER_RANK  # samples per rank and step, a multiple of k
    cap: int = 100  # bucket size in bytes (buckets)

    def __str__(self) -> str:
        return (f"seed {self.seed}, {str(self.dtype).replace('torch.', '')}, "
                + ("a frozen layer, " if self.frozen else "")
                + ("samples dealt in turn" if self.interleave else "contiguous slices")
                + f", widths {list(self.widths)}, k={self.k}, {self.per_rank} samples per rank, buckets of "
                  f"{self.cap} bytes")


def _drawn_setups(n: int, seed: int = 7) -> list[Setup]:
    """``n`` set-ups from a seeded generator, the same on every rank and every run (every rank must build the same
    models): other widths and depths, 2 to 4 micro-batches, bucket sizes from one byte (a bucket per parameter) to
    more than the model (one bucket)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        k = rng.choice((2, 4))
        out.append(Setup(2 + i, rng.choice((torch.float32, torch.float64)), i % 2 == 0, i % 2 == 1,
                         tuple(rng.randint(2, 9) for _ in range(rng.randint(2, 4))), k, k * rng.randint(1, 2),
                         (10**9, 1)[i % 2]))
    return out


#: Two fixed set-ups, then drawn ones (fp32 and fp64, odd widths, k of 2 and 4, one bucket and a bucket per parameter).
SETUPS = (Setup(0, torch.float32, False, False), Setup(1, torch.float64, True, True), *_drawn_setups(2))


def _tol(model: nn.Module) -> float:
    return TOLERANCE.get(next(model.parameters()).dtype, TOL)


@contextlib.contextmanager
def _in(setup: Setup):
    """Adds the set-up to a failure's message, so that the student can reproduce it."""
    try:
        yield
    except Bad as exc:
        raise Bad(f"{exc} [set-up: {setup}]") from None


def _mlp(setup: Setup = SETUPS[0]) -> nn.Module:
    """Linear layers of different sizes (6 -> widths -> 3) with Tanh between, the third without bias, small first
    layers (so that a bucket plan has a last, partial bucket); no BatchNorm (so that one process on the global batch
    computes the same gradients). With ``setup.frozen`` the second Linear layer is frozen."""
    torch.manual_seed(setup.seed)
    dims = [6, *setup.widths, 3]
    layers: list[nn.Module] = []
    for j in range(len(dims) - 1):
        layers += [nn.Linear(dims[j], dims[j + 1], bias=j != 2), nn.Tanh()]
    model = nn.Sequential(*layers[:-1]).to(setup.dtype)
    if setup.frozen:
        model[2].requires_grad_(False)
    return model


def _names(model: nn.Module, idx) -> list[str]:
    names = [n for n, _ in model.named_parameters()]
    return [names[i] for i in idx]


def _world() -> tuple[int, int]:
    return dist.get_rank(), dist.get_world_size()


def _owner(setup: Setup, world: int) -> torch.Tensor:
    """Which rank each sample of the global batch goes to."""
    i = torch.arange(world * setup.per_rank)
    return i % world if setup.interleave else i // setup.per_rank


def _global_batch(setup: Setup, world: int, step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(50 + 100 * setup.seed + step)
    x = torch.randn(world * setup.per_rank, 6, generator=gen, dtype=torch.float64)
    x = (x * (1 + _owner(setup, world))[:, None]).to(setup.dtype)  # the ranks' samples differ in scale
    return x, torch.randint(0, 3, (world * setup.per_rank,), generator=gen)


def _local(setup: Setup, batch, rank: int, world: int):
    rows = (_owner(setup, world) == rank).nonzero().flatten()
    return batch[0][rows], batch[1][rows]


def _grads(model: nn.Module) -> list[torch.Tensor | None]:
    return [None if p.grad is None else p.grad.detach().clone() for p in model.parameters()]


def _weights(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _trainable(model: nn.Module) -> list[bool]:
    return [p.requires_grad for p in model.parameters()]


def _reference(setup: Setup, steps: int) -> list[dict]:
    """Per step, from the weights one process has at that step: this rank's slice's gradients alone
    (``local``), DDP's, those of one process on the global batch (``single``), its weights before and after
    SGD(lr LR), and the gradients of this rank's last micro-batch (``last``, divided by k)."""
    K = setup.k  # noqa: N806 - the micro-batches per step, as in the exercise
    rank, world = _world()
    single, ddp = _mlp(setup), DDP(_mlp(setup))
    opt_s, opt_d = (torch.optim.SGD(m.parameters(), lr=LR) for m in (single, ddp))
    out = []
    for step in range(steps):
        batch = _global_batch(setup, world, step)
        data = _local(setup, batch, rank, world)
        local = copy.deepcopy(single)
        F.cross_entropy(local(data[0]), data[1]).backward()
        last = copy.deepcopy(single)
        F.cross_entropy(last(data[0][K - 1::K]), data[1][K - 1::K]).backward()
        with torch.no_grad():
            losses = [float(F.cross_entropy(single(data[0][i::K]), data[1][i::K])) for i in range(K)]
        start = _weights(single)
        opt_s.zero_grad()
        F.cross_entropy(single(batch[0]), batch[1]).backward()
        opt_s.step()
        opt_d.zero_grad()
        F.cross_entropy(ddp(data[0]), data[1]).backward()
        opt_d.step()
        out.append({"start": start, "after": _weights(single), "single": _grads(single), "ddp": _grads(ddp.module),
                    "local": _grads(local), "last": [None if g is None else g / K for g in _grads(last)],
                    "micro_losses": losses, "data": data})
    return out


# ----------------------------------------------------------------------------------------------------
# Comparing, and naming what differs
# ----------------------------------------------------------------------------------------------------
def _close(got: torch.Tensor | None, want: torch.Tensor | None, tol: float = TOL) -> bool:
    if got is None or want is None or got.shape != want.shape:
        return False
    got, want = got.double(), want.double()
    return bool(((got - want).abs() <= tol + tol * want.abs()).all())


def _max_diff(got: list, want: list, keep: list[bool]) -> float:
    out = 0.0
    for g, w, k in zip(got, want, keep):
        if k:
            out = max(out, float((g.double() - w.double()).abs().max()) if g is not None and g.shape == w.shape
                      else float("inf"))
    return out


def _classify(got: list, ref: dict, keep: list[bool], tol: float, extra: dict | None = None) -> dict[str, list[int]]:
    """Each kept parameter's gradient: "ok" (the average), or which known wrong value it equals."""
    _, world = _world()
    patterns: dict[str, list] = {"ok": ref["single"]}
    if world > 1:
        patterns["sum"] = [None if g is None else g * world for g in ref["single"]]
        patterns["twice"] = [None if g is None else g / world for g in ref["single"]]
        patterns["local"] = ref["local"]
    patterns.update(extra or {})
    out: dict[str, list[int]] = {}
    for i, (g, k) in enumerate(zip(got, keep)):
        if not k:
            continue
        if g is None:
            out.setdefault("missing", []).append(i)
            continue
        kind = next((name for name, want in patterns.items() if _close(g, want[i], tol)), "other")
        out.setdefault(kind, []).append(i)
    return out


_GRAD_MESSAGES = {
    "sum": "the gradients are {world} times (the world size) too large: all_reduce sums, the sum must still be "
           "divided by the number of ranks",
    "twice": "the gradients are {world} times (the world size) too small: they were divided twice (ReduceOp.AVG "
             "already averages; or the same gradients were divided again)",
    "local": "{what} still holds this rank's own gradient: no average reached it (the all-reduce must act on the "
             "gradient tensor itself, in place, not on a copy, and any result must be copied back where the "
             "optimizer reads it)",
}


_WEIGHT_MESSAGES = {
    "sum": "the step used gradients {world} times (the world size) too large: summed over the ranks, not averaged",
    "twice": "the step used gradients {world} times (the world size) too small: they were divided twice",
    "local": "the step used this rank's own gradient, not the average: the ranks' weights differ",
}


def _common_ratio(got: list, want: list, keep: list[bool]) -> float | None:
    """r when every kept gradient is r times the expected one (r not 1, nor the world size or its inverse)."""
    pairs = [(g.double(), w.double()) for g, w, k in zip(got, want, keep) if k and g is not None and g.shape == w.shape]
    den = sum(float((w * w).sum()) for _, w in pairs)
    if not pairs or den == 0:
        return None
    r = sum(float((g * w).sum()) for g, w in pairs) / den
    _, world = _world()
    if any(abs(r - x) < 1e-6 * max(1.0, x) for x in (1.0, float(world), 1.0 / world)):
        return None
    return r if all(_close(g, w * r, 1e-5) for g, w in pairs) else None


def _diagnose(got: list, ref: dict, model: nn.Module, what: str = "p.grad") -> dict:
    """Check gradients against one process's and DDP's; raise Bad naming the likely mistake."""
    rank, world = _world()
    keep = _trainable(model)
    tol = _tol(model)
    kinds = _classify(got, ref, keep, tol)
    if "missing" in kinds:
        raise Bad(f"{what} is None for {_names(model, kinds['missing'])} after finishing: every trained parameter "
                  "needs its averaged gradient")
    diffs = {"ddp": _max_diff(got, ref["ddp"], keep), "single": _max_diff(got, ref["single"], keep)}
    if set(kinds) == {"ok"}:
        return diffs
    wrong = [k for k in kinds if k != "ok"]
    ratio = _common_ratio(got, ref["single"], keep)
    if ratio is not None:
        raise Bad(f"the gradients are {ratio:.3g} times the average: the sum over the ranks must be divided by the "
                  f"world size ({world} here, dist.get_world_size()), not by a fixed number")
    if len(wrong) == 1 and wrong[0] in _GRAD_MESSAGES:
        message = _GRAD_MESSAGES[wrong[0]].format(world=world, what=what)
        if "ok" in kinds:
            message = f"{_names(model, kinds[wrong[0]])} only: " + message
        raise Bad(message)
    raise Bad(f"the gradients differ from one process's on the global batch by up to {diffs['single']:.2g} "
              f"(allowed: {tol:g} + {tol:g} x |g|) and from DDP's by up to {diffs['ddp']:.2g}")


def _check_weights(model: nn.Module, before: list, ref: dict, *, context: str = "", extra: dict | None = None,
                   messages: dict | None = None, k: int = K) -> None:
    """The weights after the step must be one process's (so equal on every rank). Otherwise the effective
    gradient (before - after) / LR says what the step used."""
    rank, world = _world()
    after = _weights(model)
    keep = _trainable(model)
    moved = [n for n, b, a, k in zip(_names(model, range(len(after))), before, after, keep)
             if not k and not torch.equal(b, a)]
    _expect(not moved, f"the frozen parameter(s) {moved} changed: a parameter with requires_grad=False must not "
                       "be trained")
    tol = _tol(model)
    if all(_close(a, w, tol) for a, w, t in zip(after, ref["after"], keep) if t):
        return
    effective = [(b.double() - a.double()) / LR for b, a in zip(before, after)]
    if all(float(e.abs().max()) == 0 for e, k in zip(effective, keep) if k):
        raise Bad("the weights did not change: optimizer.step() must run once, after the gradients are averaged")
    kinds = _classify(effective, ref, keep, 1e-4, extra)
    wrong = [k for k in kinds if k != "ok"]
    messages = {**_WEIGHT_MESSAGES, **(messages or {})}
    if len(wrong) == 1 and wrong[0] in messages:
        raise Bad(messages[wrong[0]].format(world=world, what="p.grad", k=k) + context)
    diff = _max_diff(after, ref["after"], keep)
    raise Bad(f"after the optimizer step the weights differ from one process's on the global batch by up to "
              f"{diff:.2g}{context}")


def _loss_backward(model: nn.Module, data, timeline: Timeline | None = None) -> None:
    loss = F.cross_entropy(model(data[0]), data[1])
    with (timeline.span("backward") if timeline is not None else contextlib.nullcontext()):
        loss.backward()


def _frozen_error(setup: Setup, exc: Exception, what: str) -> Bad:
    return Bad(f"{what} raised {type(exc).__name__} on a model with a frozen layer ({' '.join(str(exc).split())[:120]}):"
               " a parameter with requires_grad=False never gets a gradient (p.grad stays None) and needs no "
               "average, so it must be skipped")
