"""Command-line parsing for the course's scripts: a bad option or value is one line, before any work starts.

argparse's default answer to a mistake is the whole usage block (14-17 lines for a script with many options) and a
bad value found later is a traceback; on a cluster both land in a log read after the queue wait. Here:

- :class:`ScriptParser` prints ``fsdp_train.py: error: argument --global-batch: must be >= 1, got 0 (see
  fsdp_train.py --help)`` and exits with 2;
- :func:`at_least` builds the ``type=`` of an integer option with a lower bound (``type=at_least(1)``), so a count
  of 0 or -5 is refused by the parser itself;
- :meth:`ScriptParser.refuse` turns the ``ValueError`` of a later consistency check (two options that do not go
  together) into the same one line;
- :func:`positive_number` and :func:`device_name` are the ``type=`` of a number that must be ``> 0`` and of a
  ``--device`` option (``auto``, ``cpu``, ``cuda``, ``cuda:N``).
"""
from __future__ import annotations

import argparse
from typing import Callable, NoReturn, Sequence

from dlo.runtime.context import dist_context


class ScriptParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line with what to do, and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def refuse(self, exc: ValueError) -> NoReturn:
        """The one-line error for a value the parser accepted but a later check refused."""
        self.error(str(exc))


def at_least(minimum: int) -> Callable[[str], int]:
    """``type=`` of an integer option that must be ``>= minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    parse.__name__ = f"integer >= {minimum}"
    return parse



def comma_list_among(names: Sequence[str], what: str = "value") -> Callable[[str], list[str]]:
    """``type=`` of a comma-separated list whose every item is one of ``names`` (``--dtypes float32,bfloat16``)."""

    def parse(text: str) -> list[str]:
        values = text.split(",")
        unknown = [v for v in values if v not in names]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {what}(s) {', '.join(map(repr, unknown))}: use "
                                             f"{', '.join(names)}")
        return values

    parse.__name__ = f"comma-separated {what}s"
    return parse

def device_name(text: str) -> str:
    """``type=`` of a ``--device`` option: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``, the names
    :func:`dlo.runtime.device.pick_device` takes (whether that GPU is there is its question, later)."""
    name = text.strip().lower()
    if name in ("auto", "cpu", "cuda") or (name.startswith("cuda:") and name[5:].isdigit()):
        return name
    raise argparse.ArgumentTypeError(f"unknown device {text!r}: use auto, cpu, cuda or cuda:N")


def positive_number(text: str) -> float:
    """``type=`` of a number option that must be ``> 0`` (a learning rate, a size in MiB, seconds)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not value > 0:  # NaN included
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def parse_for_launch(parser: ScriptParser, check: Callable[[argparse.Namespace, int], None],
                     argv: Sequence[str] | None = None) -> argparse.Namespace:
    """``parser``'s options, then ``check(args, world_size)`` against this launch's process count, read from
    torchrun's or srun's variables before any process group exists; the ``ValueError`` it raises is refused in one
    line (exit code 2). Every rank finds the same mistake and says it: a launcher stops the other ranks at the
    first that fails, so a line left to rank 0 could be lost."""
    args = parser.parse_args(argv)
    try:
        check(args, dist_context().world_size)
    except ValueError as exc:
        parser.refuse(exc)
    return args
