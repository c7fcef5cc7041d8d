"""Steps 3 and 4: asynchronous all-reduces launched during backward, one per parameter then one per bucket (and
the bucket plan, asked for several dtypes and bucket sizes)."""
from __future__ import annotations

import random
from typing import Callable

import torch
from torch import nn

from dlo.parallel.dp_events import Timeline, record_collectives
from dlo.course.dp_scratch_cases.common import (
    Bad, LR, SETUPS, Setup, _check_weights, _diagnose, _expect, _frozen_error, _grads, _in, _loss_backward, _mlp,
    _reference, _trainable, _weights, _world,
)
from dlo.course.dp_scratch_cases.naive_broadcast import _check_handles


def _check_async_collectives(timeline: Timeline, expected: int, unit: str) -> None:
    calls = timeline.collectives()
    during = [e for e in calls if e["during"] == "backward"]
    _expect(calls, "no all-reduce was launched: the hooks registered in __init__ must launch them during backward")
    _expect(during, "the all-reduces ran after backward, not during it: each one must be launched from the hook "
                    "(register_post_accumulate_grad_hook), while backward goes on")
    blocking = [e for e in during if not e["async_op"]]
    _expect(not blocking, "the all-reduce inside the hook blocks: backward stops until it completes, so nothing "
                          "overlaps backward (an asynchronous launch, async_op=True, returns at once)")
    _check_handles(calls)
    at_once = [e for e in during if e["wait_during"] == "backward" and e["wait_seq"] == e["seq"] + 1]
    _expect(not at_once, f"{len(at_once)} of {len(during)} all-reduces are waited for inside the hook, right after "
                         "their launch: nothing overlaps backward (keep the handles, wait for them in finish(), "
                         "once backward is over)")
    after = [e for e in calls if e["during"] != "backward"]
    _expect(not after, f"{len(after)} all-reduces were launched after backward: every one belongs in the hook")
    _expect(len(during) == expected, f"{len(during)} all-reduces during backward for {expected} {unit}: one per "
                                     f"{unit.rstrip('s')}, launched once (hooks registered once, in __init__)")


def _construct(make: Callable, model: nn.Module, setup: Setup, what: str):
    try:
        return make(model)
    except RuntimeError as exc:
        if setup.frozen and "require" in str(exc) and "grad" in str(exc):
            raise _frozen_error(setup, exc, what) from None
        raise


def _run_sync(make: Callable, setup: Setup, what: str, launched_check: Callable[[list, int], None] | None,
              expected: Callable[[nn.Module], tuple[int, str]]) -> dict:
    rank, world = _world()
    ref = _reference(setup, steps=2)
    model = _mlp(setup)
    sync = _construct(make, model, setup, what)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    diffs: dict = {}
    for step, set_to_none in ((0, True), (1, False)):
        timeline = Timeline()
        opt.zero_grad(set_to_none=set_to_none)
        with record_collectives(timeline, defer=True):
            _loss_backward(model, ref[step]["data"], timeline)
            with timeline.span("finish"):
                try:
                    sync.finish()
                except (AttributeError, TypeError) as exc:
                    if setup.frozen and "None" in str(exc):
                        raise _frozen_error(setup, exc, "finish()") from None
                    raise
        if launched_check is not None:
            launched_check([e["numel"] for e in timeline.collectives() if e["during"] == "backward"], step)
        _check_async_collectives(timeline, *expected(model))
        _expect(not getattr(sync, "pending", None), "self.pending must be empty at the end of finish(): otherwise "
                                                    "the next finish() waits for and divides this step's work again")
        diffs = _diagnose(_grads(model), ref[step], model)
        before = _weights(model)
        opt.step()
        _check_weights(model, before, ref[step])
    return diffs


def case_overlap(ns: dict) -> dict:
    cls = ns["OverlappedGradSync"]
    diffs: dict = {}
    for setup in SETUPS:
        with _in(setup):
            diffs = _run_sync(cls, setup, "OverlappedGradSync(model)", None,
                              lambda m: (sum(_trainable(m)), "trained parameters"))
    return diffs


def _ref_plan(params, bucket_bytes: int, *, reverse: bool = True, size=lambda p: p.numel() * p.element_size(),
              strict: bool = False) -> list[list[int]]:
    order = reversed(range(len(params))) if reverse else range(len(params))
    buckets, current, total = [], [], 0
    for i in order:
        if strict and current and total + size(params[i]) > bucket_bytes:
            buckets.append(current)
            current, total = [], 0
        current.append(i)
        total += size(params[i])
        if not strict and total >= bucket_bytes:
            buckets.append(current)
            current, total = [], 0
    if current:
        buckets.append(current)
    return buckets


#: The plan's fixed inputs: sizes and dtypes (2, 2, 4, 8 bytes per element), and bucket sizes in bytes, some of which
#: divide no tensor's size.
PLAN_PARAMS = ((10, torch.float32), (3, torch.bfloat16), (7, torch.float16), (20, torch.float32),
               (5, torch.float64), (8, torch.bfloat16), (2, torch.float32), (9, torch.float16))
PLAN_CAPS = (40, 48, 30, 1, 10**9)
_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def plan_cases(n: int = 12, seed: int = 5) -> list[tuple[tuple, tuple]]:
    """The fixed case, then ``n`` drawn from a seeded generator (the same on every rank and run): 1 to 9 tensors of 1
    to 24 elements, vectors and matrices (as weights are), in one dtype or mixed ones, and bucket sizes of one byte, of exactly a running total of the
    sizes (a bucket that closes on its last byte), one byte less and more, a tensor larger than the cap, and more than
    the whole."""
    rng = random.Random(seed)
    cases = [(PLAN_PARAMS, PLAN_CAPS)]
    for i in range(n):
        one = rng.choice(_DTYPES)
        params = tuple(((rng.randint(1, 24),) if rng.random() < 0.4 else (rng.randint(1, 5), rng.randint(2, 6)),
                        one if i % 3 == 0 else rng.choice(_DTYPES)) for _ in range(rng.randint(1, 9)))
        sizes = [torch.empty(m, dtype=d).nbytes for m, d in reversed(params)]
        running = sum(sizes[:rng.randint(1, len(sizes))])
        caps = tuple(sorted({1, running, max(1, running - 1), running + 1, max(sizes) // 2 + 1, sum(sizes) + 1}))
        cases.append((params, caps))
    return sorted(cases, key=lambda c: len(c[0]))


def _normalised(plan) -> list[list[int]] | None:
    """A plan with each bucket's indices sorted: the order inside a bucket does not matter."""
    try:
        return [sorted(int(i) for i in b) for b in plan]
    except TypeError:
        return None


#: Known wrong plans, by the rule they follow instead of DDP's.
_KNOWN_PLANS = (
    ("the buckets must be filled in reverse registration order: the last parameters' gradients are ready first",
     {"reverse": False}),
    ("bucket_bytes is in bytes: a gradient's size is numel() * element_size(), not numel()",
     {"size": lambda p: p.numel()}),
    ("the byte count assumes 4-byte elements: bf16 and fp16 gradients take 2 bytes per element, fp64 8; "
     "numel() * element_size() is the size in bytes", {"size": lambda p: p.numel() * 4}),
    ("a bucket closes once its gradients add up to at least bucket_bytes (DDP's rule), not before they would "
     "exceed it", {"strict": True}),
)


def _check_plan(plan_buckets: Callable) -> None:
    got, want, known = [], [], {message: [] for message, _ in _KNOWN_PLANS}
    for spec, caps in plan_cases():
        params = [torch.empty(n, dtype=d) for n, d in spec]
        for cap in caps:
            got.append(_normalised(plan_buckets(params, cap)))
            want.append(_normalised(_ref_plan(params, cap)))
            for message, kwargs in _KNOWN_PLANS:
                known[message].append(_normalised(_ref_plan(params, cap, **kwargs)))
    if got == want:
        return
    for message, plans in known.items():  # named only when every plan tried follows that rule
        if got == plans:
            raise Bad(message)
    if all(g in (w, w[:-1]) for g, w in zip(got, want)):  # dropped wherever a partial one is left
        raise Bad("the last, partial bucket is missing: what remains after the loop is a bucket too")
    j = 0
    for spec, caps in plan_cases():
        for cap in caps:
            if got[j] != want[j]:
                shown = [(list(n) if isinstance(n, tuple) else n, str(d).replace('torch.', '')) for n, d in spec]
                raise Bad(f"plan_buckets(tensors of {shown}, {cap} bytes): expected {want[j]}, got {got[j]}")
            j += 1


def case_buckets(ns: dict) -> dict:
    _check_plan(ns["plan_buckets"])
    cls = ns["BucketedGradSync"]
    diffs: dict = {}
    for setup in SETUPS:
        with _in(setup):
            probe = _mlp(setup)
            params = [p for p in probe.parameters() if p.requires_grad]
            cap = setup.cap  # 100 bytes in the first set-ups: fp32 [8, 7, 6, 5] [4] [3, 2] and the last, partial [1, 0]
            plan = _ref_plan(params, cap)
            sizes = sorted(sum(params[i].numel() for i in b) for b in plan)

            def launched_check(launched: list[int], step: int) -> None:
                if step == 1 and not launched:
                    raise Bad("no bucket was launched in the second step: the ready counts (self.ready) must be "
                              "reset in finish()")
                if len(plan) < len(params) and sorted(launched) == sorted(p.numel() for p in params):
                    raise Bad("one all-reduce per parameter: each gradient must be copied into its bucket's flat "
                              "buffer, and the buffer all-reduced once, when the bucket holds all its gradients")
                if launched and sorted(launched) == sorted(sum(params[i].numel() for i in b) for b in plan[:-1]):
                    raise Bad("the last, partial bucket was never all-reduced: a bucket is launched when all its "
                              "gradients are in (self.ready[b] == len(self.plan[b])), not when it holds bucket_bytes")
                _expect(sorted(launched) == sizes, f"the all-reduced buffers hold {sorted(launched)} values, the "
                                                   f"buckets {sizes}: each bucket's whole buffer is all-reduced once")

            diffs = _run_sync(lambda m: cls(m, cap), setup, "BucketedGradSync(model, bucket_bytes)", launched_check,
                              lambda m: (len(plan), "buckets"))
    return diffs
