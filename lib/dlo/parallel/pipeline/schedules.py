"""The reference schedules, written with the :class:`~dlo.parallel.pipeline.pipe.Pipe`'s building blocks:
naive, all-forward-all-backward (GPipe), 1F1B and interleaved 1F1B, and :func:`train_step` that runs one."""
from __future__ import annotations

from collections.abc import Callable, Sequence

from dlo.parallel.pipeline.pipe import Pipe, StepStats

SCHEDULE_NAMES = ("naive", "afab", "1f1b", "interleaved")



# ----------------------------------------------------------------------------------------------------
# Reference schedules (the workshop's solutions)
# ----------------------------------------------------------------------------------------------------
def _forward(pipe: Pipe, mb: int, chunk: int = 0) -> None:
    x = pipe.recv_forward(mb, chunk)
    y = pipe.forward_compute(mb, x, chunk)
    pipe.send_forward(mb, y, chunk)


def _backward(pipe: Pipe, mb: int, chunk: int = 0) -> None:
    g = pipe.recv_backward(mb, chunk)
    dx = pipe.backward_compute(mb, g, chunk)
    pipe.send_backward(mb, dx, chunk)


def naive_step(pipe: Pipe) -> None:
    """The whole batch as one micro-batch: forward, then backward; stage k waits for stage k-1."""
    if pipe.micro_batches != 1:
        raise ValueError(f"the naive schedule runs the whole batch at once: build the Pipe with micro_batches=1, "
                         f"not {pipe.micro_batches}")
    _forward(pipe, 0)
    _backward(pipe, 0)


def afab_step(pipe: Pipe) -> None:
    """GPipe: all forwards, then all backwards (micro-batch order)."""
    for mb in range(pipe.micro_batches):
        _forward(pipe, mb)
    for mb in range(pipe.micro_batches):
        _backward(pipe, mb)


def one_f_one_b_actions(rank: int, num_stages: int, micro_batches: int) -> list[tuple[str, int]]:
    """The 1F1B order of one rank: ``[("F", 0), ("F", 1), ("B", 0), ...]``."""
    warmup = min(num_stages - rank - 1, micro_batches)
    actions = [("F", mb) for mb in range(warmup)]
    for i in range(micro_batches - warmup):
        actions += [("F", warmup + i), ("B", i)]
    actions += [("B", mb) for mb in range(micro_batches - warmup, micro_batches)]
    return actions


def one_f_one_b_step(pipe: Pipe) -> None:
    """1F1B: ``p - rank - 1`` warm-up forwards, then one forward / one backward, then the remaining backwards.

    In the steady state the Pipe posts a forward's send together with the next backward's receive (both
    with the next stage), and a backward's send with the next forward's receive (both with the previous
    stage): Megatron-LM's ``send_forward_recv_backward`` and ``send_backward_recv_forward``."""
    for kind, mb in one_f_one_b_actions(pipe.rank, pipe.world_size, pipe.micro_batches):
        (_forward if kind == "F" else _backward)(pipe, mb)


def interleaved_warmup(rank: int, num_stages: int, micro_batches: int, virtual: int) -> int:
    """How many forwards rank ``rank`` runs before its first backward in interleaved 1F1B (Megatron-LM's
    count): all ``m * v`` of them if ``m == p``, else ``(p - rank - 1) * 2 + (v - 1) * p`` (at most all)."""
    p, m, v = num_stages, micro_batches, virtual
    return m * v if m == p else min(m * v, (p - rank - 1) * 2 + (v - 1) * p)


def interleaved_actions(rank: int, num_stages: int, micro_batches: int, virtual: int
                        ) -> list[tuple[str, int, int]]:
    """Megatron's interleaved 1F1B order for one rank: ``(kind, micro-batch, chunk)``.

    Micro-batches go in groups of ``p``: forward chunk 0 of the group, then chunk 1, ...; backwards visit
    the chunks in reverse. Warm-up: :func:`interleaved_warmup` forwards, then one forward / one backward,
    then the backwards left. Needs ``micro_batches`` to be a multiple of ``p``.
    """
    p, m, v = num_stages, micro_batches, virtual
    if m % p:
        raise ValueError(f"interleaved 1F1B takes micro-batches in groups of {p} stages: use a multiple of {p}, not {m}")
    total = m * v

    def fwd(k: int) -> tuple[int, int]:  # k-th forward of this rank -> (micro-batch, chunk)
        group, within = divmod(k, p * v)
        return group * p + within % p, within // p

    def bwd(k: int) -> tuple[int, int]:
        mb, chunk = fwd(k)
        return mb, v - 1 - chunk

    warmup = interleaved_warmup(rank, p, m, v)
    actions: list[tuple[str, int, int]] = [("F", *fwd(k)) for k in range(warmup)]
    for i in range(total - warmup):
        actions += [("F", *fwd(warmup + i)), ("B", *bwd(i))]
    actions += [("B", *bwd(k)) for k in range(total - warmup, total)]
    return actions


def interleaved_steps(rank: int, num_stages: int, micro_batches: int, virtual: int
                      ) -> list[list[tuple[str, int, int]]]:
    """:func:`interleaved_actions` cut into the steps whose transfers go out together: one forward per step
    in the warm-up, one forward + one backward per step in the steady state, one backward per step in the
    cool-down."""
    actions = interleaved_actions(rank, num_stages, micro_batches, virtual)
    warmup = interleaved_warmup(rank, num_stages, micro_batches, virtual)
    steady = micro_batches * virtual - warmup
    steps = [[a] for a in actions[:warmup]]
    steps += [actions[warmup + 2 * i: warmup + 2 * i + 2] for i in range(steady)]
    steps += [[a] for a in actions[warmup + 2 * steady:]]
    return steps


def _step(pipe: Pipe, actions: Sequence[tuple[str, int, int]]) -> None:
    """Ask for every input of ``actions``, run their computes, then ask for every output to be sent: the
    receives of this step go out with the sends of the previous one, in one batch."""
    inputs = [pipe.recv_forward(mb, c) if kind == "F" else pipe.recv_backward(mb, c) for kind, mb, c in actions]
    outputs = [pipe.forward_compute(mb, x, c) if kind == "F" else pipe.backward_compute(mb, x, c)
               for (kind, mb, c), x in zip(actions, inputs)]
    for (kind, mb, c), y in zip(actions, outputs):
        (pipe.send_forward if kind == "F" else pipe.send_backward)(mb, y, c)


def interleaved_step(pipe: Pipe) -> None:
    """Interleaved 1F1B over this rank's chunks (see :func:`interleaved_actions`), step by step
    (:func:`interleaved_steps`). In the steady state both receives of a step are asked for before its two
    computes: they go out with the previous step's two sends, four transfers in one batch (Megatron-LM's
    ``send_forward_backward_recv_forward_backward``). One forward then one backward, each with its own
    transfers, would deadlock on NCCL: the ranks form a ring, and a rank whose next forward needs no
    receive would post its gradient send alone."""
    for step in interleaved_steps(pipe.rank, pipe.world_size, pipe.micro_batches, len(pipe.chunks)):
        _step(pipe, step)


SCHEDULES: dict[str, Callable[[Pipe], None]] = {"naive": naive_step, "afab": afab_step, "1f1b": one_f_one_b_step,
                                                "interleaved": interleaved_step}


def train_step(pipe: Pipe, schedule: str | Callable[[Pipe], None]) -> StepStats:
    """``pipe.reset()``, run one schedule, ``pipe.finish()``. Call ``optimizer.step()`` after it."""
    fn = SCHEDULES.get(schedule) if isinstance(schedule, str) else schedule
    if fn is None:
        raise ValueError(f"unknown schedule {schedule!r}: choose one of {', '.join(SCHEDULES)}")
    pipe.reset()
    fn(pipe)
    return pipe.finish()
