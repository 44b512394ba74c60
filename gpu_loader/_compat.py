"""What Python 3.10 lacks and the package uses (the package supports 3.10 and later)."""

from __future__ import annotations

import contextlib


def add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)``, also on Python 3.10 where the method does not exist, and on
    an exception whose ``__notes__`` is not a list: ``add_note`` raises TypeError there
    (QA52: a class attribute ``__notes__ = ()`` turned one failed sample into a fatal
    error). An exception that takes no attributes keeps its notes as they are."""
    notes = getattr(exc, "__notes__", None)
    if isinstance(notes, list):
        notes.append(note)
        return
    kept = list(notes) if isinstance(notes, tuple) else []
    with contextlib.suppress(Exception):
        exc.__notes__ = [*kept, note]  # type: ignore[attr-defined]
