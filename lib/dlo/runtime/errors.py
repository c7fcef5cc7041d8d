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
