"""Checkers of tp_pipeline/pipeline_train.py (``dlo check pipeline <step>``): the schedules you write.

A schedule is an order of calls on a :class:`dlo.parallel.pipeline.Pipe`. Each checker runs your function
three times, in this process:

1. on a *recording* pipe for every rank of a 2- and a 4-stage pipeline: the calls must pass the right
   tensors along (the input of micro-batch ``i`` into its forward, its output into the send, ...) and
   come in the expected order (with the activations the schedule promises);
2. on a :class:`dlo.parallel.p2p_replay.DryRunPipe` for every rank: the transfers it posts are replayed
   under NCCL's rules and must not deadlock (on GPUs the order of the receives and sends matters, not
   only the order of the computes);
3. on a real one-stage :class:`Pipe` (the whole model): the gradients must equal the model's own
   ``loss.backward()`` on the whole batch, i.e. every micro-batch ran forward and backward once.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

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

    def __init__(self, rank: int, world_size: int, micro_batches: int, chunks: int = 1) -> None:
        self.rank, self.world_size, self.micro_batches = rank, world_size, micro_batches
        self.chunks = [None] * chunks
        self.actions: list[tuple] = []
        self.in_flight = self.max_in_flight = 0
        # a step of an interleaved schedule asks for both inputs before its two computes and sends both
        # outputs after them: one compute may come between a transfer and its compute there, none elsewhere
        self.slack = 0 if chunks == 1 else 1
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
            raise CheckFailed(f"rank {self.rank}: backward_compute({mb}) before the forward of micro-batch {mb}")
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


def _orders(fn: Callable, world: int, m: int, chunks: int = 1) -> list[RecordingPipe]:
    pipes = []
    for rank in range(world):
        pipe = RecordingPipe(rank, world, m, chunks)
        fn(pipe)
        every = {(k, mb, c) for k in "FB" for mb in range(m) for c in range(chunks)}
        missing = sorted(every - set(pipe.actions))
        expect(not missing, f"rank {rank} of {world}, m={m}: {len(missing)} action(s) never ran, e.g. "
                             f"{missing[0][0]} of micro-batch {missing[0][1]}: every micro-batch needs a forward and a "
                             "backward on every stage (else its gradient is missing)" if missing else "")
        pipes.append(pipe)
    return pipes


def _no_deadlock(fn: Callable, world: int, m: int, chunks: int = 1, hint: str = "") -> None:
    """The transfers ``fn`` posts on every rank, replayed under NCCL's rules, all complete."""
    replay = replay_schedule(fn, world, m, chunks)
    expect(replay.ok, f"{world} stages, m={m}{f', v={chunks}' if chunks > 1 else ''}: the computes come in the "
                       f"right order but on GPUs (NCCL) the transfers would wait for each other forever:\n"
                       f"{replay.explain()}" + (f"\n{hint}" if hint else ""))


def _real_step(fn: Callable, m: int, chunks: int = 1) -> None:
    """One real pipeline step on one process (one stage holding the whole model, or `chunks` chunks of a
    one-rank interleaved pipeline): the accumulated gradients must equal the whole batch's."""

    cfg = TransformerConfig(vocab_size=32, hidden_size=16, intermediate_size=24, num_layers=2, num_heads=2,
                            name="check")
    ids, labels = token_batch(4, 6, cfg.vocab_size, seed=1)
    model = Llama(cfg, seed=0)
    stages = build_chunks(model, 0, 1, chunks) if chunks > 1 else build_stage(model, 0, 1)
    pipe = Pipe(stages, (ids, labels), m)
    pipe.reset()
    fn(pipe)
    stats = pipe.finish()
    ref = Llama(cfg, seed=0)
    loss = ref.loss(ids, labels)
    loss.backward()
    expect(abs(stats.loss - loss.item()) < 1e-5, f"loss {stats.loss} != the whole batch's {loss.item():.6f}")
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        expect(p.grad is not None and torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-6),
                f"gradient of {name} differs from the single-process one after a real step (m={m})")


def _actions(pipe: RecordingPipe) -> list[tuple[str, int]]:
    return [(k, mb) for k, mb, _ in pipe.actions]


def _warmup(actions: list) -> int:
    """How many forwards come before the first backward."""
    return next((i for i, a in enumerate(actions) if a[0] == "B"), len(actions))


def _order_problem(got: list, want: list, *, chunks: bool = False) -> str:
    """What is wrong with a 1F1B-like order, in words: the warm-up length when it differs (and only then), else
    the first action that differs and what the steady state or the cool-down expects there."""
    if _warmup(got) != _warmup(want):
        return (f"{_warmup(got)} forward(s) before the first backward, this stage needs {_warmup(want)}: the warm-up "
                "depends on how far the stage is from the last one (the last stage needs none) and on how many "
                "micro-batches there are")
    first = next(i for i, (a, b) in enumerate(zip(got + [None] * len(want), want)) if a != b)
    where = "cool-down" if all(a[0] == "B" for a in want[first:]) else "steady state"
    seen = got[first] if first < len(got) else "nothing"
    what = ("each micro-batch's backward visits the chunks in the reverse order of its forward; "
            if chunks and where == "steady state" else "")
    return (f"the warm-up is right, then action {first} ({where}) should be {want[first]}, got {seen}: {what}after "
            "the warm-up each forward is followed by the backward of the oldest micro-batch still waiting")


@register("pipeline", "naive", ("naive_step",), SCRIPT)
def _check_naive(naive_step: Callable) -> str:
    for world in (2, 3, 4):
        for pipe in _orders(naive_step, world, 1):
            expect(_actions(pipe) == [("F", 0), ("B", 0)],
                    f"rank {pipe.rank}: expected forward then backward of the one batch, got {_actions(pipe)}")
        _no_deadlock(naive_step, world, 1)
    _real_step(naive_step, 1)
    return "forward, send, then backward, send back: one batch through all stages"


@register("pipeline", "afab", ("afab_step",), SCRIPT)
def _check_afab(afab_step: Callable) -> str:
    for world, m in ((2, 4), (3, 5), (4, 8)):
        want = [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
        for pipe in _orders(afab_step, world, m):
            expect(_actions(pipe) == want, f"rank {pipe.rank} of {world}, m={m}: expected all forwards 0..{m - 1}, then "
                                            f"all backwards 0..{m - 1}; got {_actions(pipe)}")
            expect(pipe.max_in_flight == m, "AFAB keeps all m micro-batches alive before the first backward")
        _no_deadlock(afab_step, world, m)
    _real_step(afab_step, 4)
    return "all forwards, then all backwards; gradients accumulated over the micro-batches"


@register("pipeline", "1f1b", ("one_f_one_b_step",), SCRIPT)
def _check_1f1b(one_f_one_b_step: Callable) -> str:

    for world, m in ((2, 4), (3, 5), (4, 8), (4, 2)):
        for pipe in _orders(one_f_one_b_step, world, m):
            want = one_f_one_b_actions(pipe.rank, world, m)
            got = _actions(pipe)
            if got != want:
                raise CheckFailed(f"rank {pipe.rank} of {world}, m={m}: " + _order_problem(got, want))
            expect(pipe.max_in_flight <= min(world - pipe.rank, m),
                    f"rank {pipe.rank}: {pipe.max_in_flight} micro-batches alive at once, 1F1B allows world_size - rank")
        _no_deadlock(one_f_one_b_step, world, m, hint="write each forward and each backward as receive, compute, "
                                                        "send: the Pipe then posts a send with the next receive")
    _real_step(one_f_one_b_step, 4)
    return "warm-up, one forward / one backward, cool-down: at most world_size - rank micro-batches alive"


@register("pipeline", "interleaved", ("interleaved_step",), SCRIPT)
def _check_interleaved(interleaved_step: Callable) -> str:

    for world, m, v in ((2, 4, 2), (3, 6, 2), (4, 8, 2), (2, 2, 3)):
        for pipe in _orders(interleaved_step, world, m, v):
            want = interleaved_actions(pipe.rank, world, m, v)
            if pipe.actions != want:
                raise CheckFailed(f"rank {pipe.rank} of {world}, m={m}, v={v}: "
                                  + _order_problem(pipe.actions, want, chunks=True))
        _no_deadlock(interleaved_step, world, m, v, hint="go step by step: in a steady step ask for both inputs "
                                                          "(recv_forward and recv_backward) before the two computes, "
                                                          "and send both outputs after them")
    _real_step(interleaved_step, 2, chunks=2)
    return ("interleaved 1F1B: each micro-batch visits every rank v times, smaller bubble; a step's transfers go "
            "out together")
