"""One line for an exception: what a student or a log reader needs, without the traceback.

Used wherever an error is shown to a person: the launcher's "rank 1 failed first: ..." line, the DDP lesson's
tables of what went wrong, the JIT lesson's graph-break notes.
"""
from __future__ import annotations


def first_line(exc: BaseException, width: int | None = None) -> str:
    """``"TypeName: first non-empty line of the message"`` (just ``"TypeName"`` for an empty message), cut to
    ``width`` characters with ``...`` when given. Many library errors (DDP's, Dynamo's) are paragraphs; a
    table cell or a log line needs the first one."""
    msg = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), "")
    text = f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__
    if width is not None and len(text) > width:
        text = text[: width - 3] + "..."
    return text


class TooFewGPUs(ValueError):
    """A run needs more GPUs than this node shows: ``needed`` processes of one GPU each, ``visible`` GPUs.

    Raised before anything starts (:func:`dlo.runtime.launch_request.check_processes`). A ValueError, so that code that
    refuses bad input catches it as such; its own name lets ``dlo gpu-check --quick`` report a notebook that needs
    a larger node as skipped ("needs 2 GPUs") rather than failed."""

    def __init__(self, message: str, *, needed: int, visible: int) -> None:
        super().__init__(message)
        self.needed, self.visible = needed, visible
