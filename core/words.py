"""Counting in words, as every front door's text says it: ``1 file``, ``2 files``, ``3 entries``
(the MCP tools' answers and the console's pages alike)."""

from __future__ import annotations

PLURALS = {"entry": "entries", "match": "matches", "directory": "directories"}
"""Words whose plural is not the word and an ``s``."""


def plural(n: int, word: str) -> str:
    """``1 file``, ``2 files``, ``3 entries``."""
    return f"{n} {word if n == 1 else PLURALS.get(word, word + 's')}"
