"""Counting in words (core/words.py), as the MCP tools' answers and the console say it."""

from __future__ import annotations

import pytest

from core.words import plural


@pytest.mark.parametrize(
    ("n", "word", "said"),
    [
        (1, "file", "1 file"),
        (2, "file", "2 files"),
        (0, "entry", "0 entries"),
        (3, "match", "3 matches"),
        (1, "directory", "1 directory"),
        (2, "directory", "2 directories"),  # directory_tree's summary said "2 directorys"
    ],
)
def test_plural(n: int, word: str, said: str) -> None:
    assert plural(n, word) == said
