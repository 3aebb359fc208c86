"""Close-match suggestions for error messages."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """Return ``"; did you mean 'x'?"`` for the closest choice, or ``""`` when none is close."""
    matches = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {matches[0]!r}?" if matches else ""


def quoted(choices: Iterable[str]) -> str:
    """Return the choices as ``'a', 'b', 'c'`` for an error message."""
    return ", ".join(repr(choice) for choice in choices) or "(none)"
