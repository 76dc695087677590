"""Where a body's check in a worker thread has got to (:mod:`proxy.serving.body_check`).

The checks say each schema they reach (:func:`note_field`); a thread checking a body reports
to that body's holder (:func:`reporting_to`), so a check past its time can name the field it
was on. On the event loop (small bodies, checked inline) nothing listens and it costs a lookup.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

_progress = threading.local()


def note_field(where: str) -> None:
    """The check has reached the schema at ``where`` (``tools[3].function.parameters``)."""
    holder: dict[str, str] | None = getattr(_progress, "holder", None)
    if holder is not None:
        holder["field"] = where


@contextmanager
def reporting_to(holder: dict[str, str] | None) -> Iterator[None]:
    """This thread's :func:`note_field` calls go to ``holder["field"]`` meanwhile."""
    _progress.holder = holder
    try:
        yield
    finally:
        _progress.holder = None
