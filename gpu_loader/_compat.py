"""What Python 3.10 lacks and the package uses (the package supports 3.10 and later)."""

from __future__ import annotations


def add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)``, also on Python 3.10 where the method does not exist."""
    adder = getattr(exc, "add_note", None)
    if adder is not None:
        adder(note)
        return
    notes = getattr(exc, "__notes__", None)  # pragma: no cover - Python 3.10
    if not isinstance(notes, list):  # pragma: no cover
        notes = []
        exc.__notes__ = notes  # type: ignore[attr-defined]
    notes.append(note)  # pragma: no cover
