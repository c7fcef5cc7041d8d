"""Checkers of tp_pipeline/pipeline_train.py (``dlo check pipeline <step>``): the schedules you write.

A schedule is an order of calls on a :class:`dlo.parallel.pipeline.Pipe`. Each checker runs your function
on generated cases, in this process, and compares it with the library's reference schedules
(:mod:`dlo.parallel.pipeline.schedules`, the orders the simulator runs):

1. on a *recording* pipe for every rank of pipelines of p = 1, 2, 3, 4 stages (and a few drawn larger ones),
   with fewer micro-batches than stages, as many, and more but not a multiple of p (interleaved: v = 1, 2, 3
   chunks, and m not a multiple of p, which must raise ValueError): the calls must pass the right tensors along
   (the input of micro-batch ``i`` into its forward, its output into the send, ...) and come in the reference's
   order (hence with the activations in flight the schedule promises);
2. on a :class:`dlo.parallel.p2p_replay.DryRunPipe` for every rank: the transfers it posts are replayed
   under NCCL's rules and must not deadlock (on GPUs the order of the receives and sends matters, not
   only the order of the computes);
3. on a real one-rank :class:`Pipe` (the whole model, or v chunks of it), for several micro-batch counts, model
   depths and seeds: the loss and every parameter's gradient must equal the model's own ``loss.backward()`` on
   the whole batch, i.e. every micro-batch ran forward and backward once, on the right data.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from dlo.course.checks.cases import Case, compare, seeded
from dlo.course.checks.framework import CheckFailed, expect, register
from dlo.models.llama import Llama, token_batch
from dlo.models.config import TransformerConfig
from dlo.parallel.p2p_replay import replay_schedule
from dlo.parallel.pipeline import Pipe, build_chunks, build_stage
from dlo.parallel.pipeline import one_f_one_b_actions
from dlo.parallel.pipeline import interleaved_actions

SCRIPT = "tp_pipeline/pipeline_train.py"


class _Token:
    def __init__(self, what: str, mb: int, chunk: int) -> None:
        self.what, self.mb, self.chunk = what, mb, chunk

    def __repr__(self) -> str:
        return f"<{self.what} of micro-batch {self.mb}{f' chunk {self.chunk}' if self.chunk else ''}>"


class RecordingPipe:
    """Stands for one rank's Pipe: hands out tokens instead of tensors and records the compute order."""

    def __init__(self, rank: int, world_size: int, micro_batches: int, chunks: int = 1, *,
                 stepwise: bool = False) -> None:
        self.rank, self.world_size, self.micro_batches = rank, world_size, micro_batches
        self.chunks = [None] * chunks
        self.actions: list[tuple] = []
        self.in_flight = self.max_in_flight = 0
        # a step of an interleaved schedule asks for both inputs before its two computes and sends both
        # outputs after them: one compute may come between a transfer and its compute there, none elsewhere
        self.slack = 1 if stepwise or chunks > 1 else 0
        self.computes = 0
        self._asked: dict = {}  # (kind, mb, chunk) -> computes done when its input was asked for
        self._done_at: dict = {}  # (kind, mb, chunk) -> number of its compute

    def _key(self, mb: Any, chunk: Any) -> tuple[int, int]:
        if not isinstance(mb, int) or not 0 <= mb < self.micro_batches:
            raise CheckFailed(f"rank {self.rank}: micro-batch {mb!r} does not exist (0..{self.micro_batches - 1})")
        if not isinstance(chunk, int) or not 0 <= chunk < len(self.chunks):
            raise CheckFailed(f"rank {self.rank}: chunk {chunk!r} does not exist (0..{len(self.chunks) - 1})")
        return mb, chunk

    def _expect_token(self, got: Any, what: str, mb: int, chunk: int, where: str) -> None:
        if not (isinstance(got, _Token) and (got.what, got.mb, got.chunk) == (what, mb, chunk)):
            want = _Token(what, mb, chunk)
            raise CheckFailed(f"rank {self.rank}: {where} expected {want!r} (what the previous call returned), got {got!r}")

    def _transfers(self, kind: str, chunk: int, received: bool) -> bool:
        """Whether the input (``received``) or the output of a ``kind`` compute of ``chunk`` travels between
        ranks: nothing comes into the first virtual stage's forward nor the last one's backward, nothing leaves
        the last one's forward nor the first one's backward."""
        stage = chunk * self.world_size + self.rank
        first, last = stage == 0, stage == self.world_size * len(self.chunks) - 1
        return not ((first if (kind == "F") == received else last))

    def _computed(self, kind: str, key: tuple[int, int]) -> None:
        """Count a compute; its input must have been asked for just before it (at most ``slack`` computes
        earlier): a receive is posted with the next compute, which then waits for it."""
        asked = self._asked.get((kind, *key))
        if asked is not None and self._transfers(kind, key[1], received=True) and self.computes - asked > self.slack:
            what = "input" if kind == "F" else "output gradient"
            raise CheckFailed(f"rank {self.rank}: the {what} of micro-batch {key[0]} was asked for "
                              f"{self.computes - asked} compute(s) before its {'forward' if kind == 'F' else 'backward'}"
                              ": a receive is posted, and waited for, with the next compute, so asked early it makes "
                              "that compute wait for data it does not need yet (an idle stage, or a deadlock when "
                              "the data depends on that compute): receive each input just before its compute")
        self.computes += 1
        self._done_at[(kind, *key)] = self.computes

    def _sent(self, kind: str, key: tuple[int, int]) -> None:
        late = self.computes - self._done_at[(kind, *key)]
        if late > self.slack and self._transfers(kind, key[1], received=False):
            what = "output" if kind == "F" else "input gradient"
            raise CheckFailed(f"rank {self.rank}: the {what} of micro-batch {key[0]} was sent only after {late} more "
                              "compute(s): the neighbour stage waits for it meanwhile (no overlap between stages, "
                              "as in the naive schedule): send each result right after its compute")

    def recv_forward(self, mb: int, chunk: int = 0):
        key = self._key(mb, chunk)
        self._asked.setdefault(("F", *key), self.computes)
        return _Token("input", *key)

    def forward_compute(self, mb: int, x: Any, chunk: int = 0):
        key = self._key(mb, chunk)
        self._expect_token(x, "input", *key, where=f"forward_compute({mb}, x)")
        if ("F", *key) in self.actions:
            raise CheckFailed(f"rank {self.rank}: the forward of micro-batch {mb} ran twice")
        self._computed("F", key)
        self.actions.append(("F", *key))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        return _Token("output", *key)

    def send_forward(self, mb: int, y: Any, chunk: int = 0) -> None:
        key = self._key(mb, chunk)
        self._expect_token(y, "output", *key, where=f"send_forward({mb}, y)")
        self._sent("F", key)

    def recv_backward(self, mb: int, chunk: int = 0):
        # may be asked for before the forward's compute in the same step (on the last stage there is nothing
        # to receive); a receive that can never arrive shows up in the replay under NCCL's rules
        key = self._key(mb, chunk)
        self._asked.setdefault(("B", *key), self.computes)
        return _Token("output gradient", *key)

    def backward_compute(self, mb: int, g: Any, chunk: int = 0):
        key = self._key(mb, chunk)
        if ("F", *key) not in self.actions:
            at = f" chunk {chunk}" if len(self.chunks) > 1 else ""
            raise CheckFailed(f"rank {self.rank}: backward_compute({mb}) of micro-batch {mb}{at} came before its "
                              "forward")
        if g is None:
            raise CheckFailed(f"rank {self.rank}: backward_compute({mb}, None): pass the output gradient that "
                              f"recv_backward({mb}) returned (it is None on the last stage only, where the Pipe "
                              "starts from the loss)")
        self._expect_token(g, "output gradient", *key, where=f"backward_compute({mb}, g)")
        if ("B", *key) in self.actions:
            raise CheckFailed(f"rank {self.rank}: the backward of micro-batch {mb} ran twice")
        self._computed("B", key)
        self.actions.append(("B", *key))
        self.in_flight -= 1
        return _Token("input gradient", *key)

    def send_backward(self, mb: int, dx: Any, chunk: int = 0) -> None:
        key = self._key(mb, chunk)
        self._expect_token(dx, "input gradient", *key, where=f"send_backward({mb}, dx)")
        self._sent("B", key)


def _label(p: int, m: int, v: int | None = None) -> str:
    chunks = "" if v is None else f", v={v} chunk{'s' * (v > 1)}"
    return f"p={p} stage{'s' * (p > 1)}, m={m} micro-batch{'es' * (m > 1)}{chunks}"


def _case(p: int, m: int, v: int | None = None) -> Case:
    """A pipeline of ``p`` ranks, ``m`` micro-batches and (interleaved only) ``v`` chunks per rank."""
    return Case(_label(p, m, v), {"p": p, "m": m, "v": v or 1, "stepwise": v is not None},
                size=p * m * (v or 1) + p / 10)


def _flat_cases(n: int = 4) -> list[Case]:
    """p = 1..4 stages, each with fewer micro-batches than stages, as many, and more but not a multiple of p, plus
    ``n`` drawn ones up to 6 stages."""
    fixed = [_case(p, m) for p in range(1, 5) for m in sorted({1, p - 1, p, p + 1, 2 * p + 1} - {0})]
    return seeded(lambda r: _case(r.randint(2, 6), r.randint(1, 13)), n, seed=1, fixed=fixed)


def _interleaved_cases(n: int = 3) -> tuple[list[Case], list[Case]]:
    """(valid cases: p = 1..4, v = 1..3, m = p and 2p, plus drawn ones; cases where m is not a multiple of p)."""
    fixed = [_case(p, k * p, v) for p in range(1, 5) for v in (1, 2, 3) for k in (1, 2)]
    valid = seeded(lambda r: (lambda p: _case(p, p * r.randint(1, 3), r.randint(2, 3)))(r.randint(2, 5)), n, seed=2,
                   fixed=fixed)
    invalid = [_case(p, m, v) for p, m, v in ((2, 1, 2), (2, 3, 2), (3, 4, 2), (4, 6, 3), (3, 7, 1))]
    return valid, invalid


def _run_rank(fn: Callable, pipe: RecordingPipe, label: str) -> None:
    try:
        fn(pipe)
    except (CheckFailed, NotImplementedError) as exc:
        if isinstance(exc, CheckFailed):
            raise CheckFailed(f"with {label}, {exc}") from None
        raise
    except Exception as exc:  # noqa: BLE001 - any error of the answer is reported with its case
        first = (str(exc).splitlines() or [""])[0][:160]
        raise CheckFailed(f"with {label}, rank {pipe.rank}: it raised {type(exc).__name__}: {first}") from None


def _orders(fn: Callable, case: Case) -> list[RecordingPipe]:
    p, m, v = case.kwargs["p"], case.kwargs["m"], case.kwargs["v"]
    pipes = []
    for rank in range(p):
        pipe = RecordingPipe(rank, p, m, v, stepwise=case.kwargs["stepwise"])
        _run_rank(fn, pipe, case.label)
        every = {(k, mb, c) for k in "FB" for mb in range(m) for c in range(v)}
        missing = sorted(every - set(pipe.actions))
        expect(not missing, f"with {case.label}, rank {rank}: {len(missing)} action(s) never ran, e.g. "
                            f"{missing[0][0]} of micro-batch {missing[0][1]}"
                            f"{f' chunk {missing[0][2]}' if v > 1 else ''}: every micro-batch needs a forward and a "
                            "backward on every stage (else its gradient is missing)" if missing else "")
        pipes.append(pipe)
    return pipes


def _no_deadlock(fn: Callable, case: Case, hint: str = "") -> None:
    """The transfers ``fn`` posts on every rank, replayed under NCCL's rules, all complete."""
    p, m, v = case.kwargs["p"], case.kwargs["m"], case.kwargs["v"]
    if p == 1:
        return
    replay = replay_schedule(fn, p, m, v)
    expect(replay.ok, f"with {case.label}: the computes come in the right order but on GPUs (NCCL) the transfers "
                      f"would wait for each other forever:\n{replay.explain()}" + (f"\n{hint}" if hint else ""))


def _config(layers: int, hidden: int) -> TransformerConfig:
    return TransformerConfig(vocab_size=32, hidden_size=hidden, intermediate_size=hidden + 8, num_layers=layers,
                             num_heads=2, name="check")


def _real_step(fn: Callable, m: int, chunks: int = 1, layers: int = 2, hidden: int = 16, seed: int = 0) -> None:
    """One real pipeline step on one process (one stage holding the whole model, or `chunks` chunks of a
    one-rank interleaved pipeline): the loss and every accumulated gradient must equal the whole batch's."""
    label = (f"a real step on one rank, m={m}{f', v={chunks} chunks' if chunks > 1 else ''}, {layers} layer(s), "
             f"hidden {hidden}, seed {seed}")
    cfg = _config(layers, hidden)
    ids, labels = token_batch(6, 5, cfg.vocab_size, seed=seed + 1)
    model = Llama(cfg, seed=seed)
    stages = build_chunks(model, 0, 1, chunks) if chunks > 1 else build_stage(model, 0, 1)
    pipe = Pipe(stages, (ids, labels), m)
    pipe.reset()
    _run_rank(fn, pipe, label)
    stats = pipe.finish()
    ref = Llama(cfg, seed=seed)
    loss = ref.loss(ids, labels)
    loss.backward()
    problem = compare(float(stats.loss), loss.item(), "the loss", scale=10)
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        if problem:
            break
        problem = ("the gradient of {name} is missing" if p.grad is None else
                   compare(p.grad, q.grad, f"the gradient of {name}", scale=10))
    expect(not problem, f"with {label}: {problem} (reference: the whole batch's loss.backward() on the same model)")


def _order_problem(got: list, want: list, *, chunks: bool = False) -> str:
    """How a 1F1B-like order differs from the reference, in words: the warm-up length when it differs (and only
    then), else the first action that differs and what the steady state or the cool-down expects there."""
    if _warmup(got) != _warmup(want):
        return (f"{_warmup(got)} forward(s) before the first backward, this stage needs {_warmup(want)}: the warm-up "
                "depends on how far the stage is from the last one (the last stage needs none) and on how many "
                "micro-batches there are")
    first = next(i for i, (a, b) in enumerate(zip(got + [None] * len(want), want)) if a != b)
    where = "cool-down" if all(a[0] == "B" for a in want[first:]) else "steady state"
    seen = got[first] if first < len(got) else "nothing"
    said = f"the warm-up is right, then action {first} ({where}) should be {want[first]}, got {seen}: "
    if chunks and seen != "nothing" and seen[:2] == want[first][:2]:  # the right action and micro-batch, not chunk
        return said + ("a micro-batch's backwards visit the chunks in the reverse order of its forwards (last chunk "
                       "first)" if seen[0] == "B" else "a group of p micro-batches goes through one chunk before the "
                       "next chunk")
    return said + "after the warm-up each forward is followed by the backward of the oldest micro-batch still waiting"


def _actions(pipe: RecordingPipe) -> list[tuple[str, int]]:
    return [(k, mb) for k, mb, _ in pipe.actions]


def _warmup(actions: list) -> int:
    """How many forwards come before the first backward."""
    return next((i for i, a in enumerate(actions) if a[0] == "B"), len(actions))


def _afab_order(rank: int, p: int, m: int, v: int) -> list:
    return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]


def _1f1b_order(rank: int, p: int, m: int, v: int) -> list:
    return one_f_one_b_actions(rank, p, m)


def _interleaved_order(rank: int, p: int, m: int, v: int) -> list:
    return interleaved_actions(rank, p, m, v)


def _same_orders(fn: Callable, cases: list[Case], reference: Callable, explain: Callable, hint: str = "") -> None:
    """On every case and rank, ``fn``'s order equals the reference's (``explain(got, want)`` says how it differs),
    and its transfers do not deadlock."""
    for case in cases:
        p, m, v = case.kwargs["p"], case.kwargs["m"], case.kwargs["v"]
        for pipe in _orders(fn, case):
            want = reference(pipe.rank, p, m, v)
            got = pipe.actions if v > 1 or reference is _interleaved_order else _actions(pipe)
            if got != want:
                raise CheckFailed(f"with {case.label}, rank {pipe.rank}: " + explain(got, want))
        _no_deadlock(fn, case, hint)


def _short(actions: list) -> str:
    text = " ".join(f"{a[0]}{a[1]}" + (f".{a[2]}" if len(a) > 2 else "") for a in actions)
    return text if len(text) < 160 else text[:157] + "..."


@register("pipeline", "naive", ("naive_step",), SCRIPT)
def _check_naive(naive_step: Callable) -> str:
    cases = [_case(p, 1) for p in (1, 2, 3, 4, 5)]
    _same_orders(naive_step, cases, _afab_order,
                 lambda got, want: f"expected the forward then the backward of the one batch (F0 B0), got {_short(got)}")
    for layers, hidden, seed in ((1, 16, 0), (3, 24, 1)):
        _real_step(naive_step, 1, layers=layers, hidden=hidden, seed=seed)
    return f"forward, send, then backward, send back: one batch through 1 to 5 stages ({len(cases)} pipelines)"


@register("pipeline", "afab", ("afab_step",), SCRIPT)
def _check_afab(afab_step: Callable) -> str:
    cases = _flat_cases()
    _same_orders(afab_step, cases, _afab_order,
                 lambda got, want: f"expected all forwards 0..{len(want) // 2 - 1}, then all backwards "
                                   f"0..{len(want) // 2 - 1} ({_short(want)}); got {_short(got)}")
    for m, layers, hidden, seed in ((2, 1, 16, 0), (3, 2, 24, 1), (6, 3, 16, 2)):
        _real_step(afab_step, m, layers=layers, hidden=hidden, seed=seed)
    return (f"all forwards, then all backwards, on {len(cases)} pipelines (p = 1..6, m below, at and above p); "
            "gradients accumulated over the micro-batches")


@register("pipeline", "1f1b", ("one_f_one_b_step",), SCRIPT)
def _check_1f1b(one_f_one_b_step: Callable) -> str:
    cases = _flat_cases()
    _same_orders(one_f_one_b_step, cases, _1f1b_order, _order_problem,
                 hint="write each forward and each backward as receive, compute, send: the Pipe then posts a send "
                      "with the next receive")
    for m, layers, hidden, seed in ((2, 1, 16, 0), (3, 2, 24, 1), (6, 3, 16, 2)):
        _real_step(one_f_one_b_step, m, layers=layers, hidden=hidden, seed=seed)
    return (f"warm-up, one forward / one backward, cool-down on {len(cases)} pipelines: at most world_size - rank "
            "micro-batches alive")


def _expect_value_error(fn: Callable, case: Case) -> None:
    p, m, v = case.kwargs["p"], case.kwargs["m"], case.kwargs["v"]
    try:
        fn(RecordingPipe(0, p, m, v, stepwise=True))
    except ValueError:
        return
    except (CheckFailed, NotImplementedError, Exception) as exc:  # noqa: BLE001 - anything else is the answer's
        if isinstance(exc, NotImplementedError):
            raise
        outcome = (f"it ran into: {exc}" if isinstance(exc, CheckFailed) else
                   f"it raised {type(exc).__name__} ({(str(exc).splitlines() or [''])[0][:100]})")
    else:
        outcome = "it ran"
    raise CheckFailed(f"with {case.label} (m not a multiple of p), rank 0: {outcome}; the micro-batches go in groups "
                      f"of p, so m={m} must be refused with a ValueError")


@register("pipeline", "interleaved", ("interleaved_step",), SCRIPT)
def _check_interleaved(interleaved_step: Callable) -> str:
    valid, invalid = _interleaved_cases()
    _same_orders(interleaved_step, valid, _interleaved_order, lambda got, want: _order_problem(got, want, chunks=True),
                 hint="go step by step: in a steady step ask for both inputs (recv_forward and recv_backward) before "
                      "the two computes, and send both outputs after them")
    for case in invalid:
        _expect_value_error(interleaved_step, case)
    for m, v, layers, seed in ((2, 2, 2, 0), (3, 3, 3, 1), (1, 2, 4, 2)):
        _real_step(interleaved_step, m, chunks=v, layers=layers, seed=seed)
    return (f"interleaved 1F1B on {len(valid)} pipelines (p = 1..5, v = 1..3, m = p to 3p), m not a multiple of p "
            "refused: each micro-batch visits every rank v times; a step's transfers go out together")
