"""Glob semantics (one implementation for glob, include, exclude and ignore patterns)."""

from __future__ import annotations

import fnmatch

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contracts.errors import QuillError
from contracts.limits import DEFAULT_EXCLUSIONS
from core.globs import Globs, relative


@pytest.mark.parametrize(
    ("pattern", "path", "expected"),
    [
        ("*.py", "a.py", True),
        ("*.py", "src/a.py", False),  # * stays within a directory
        ("**/*.py", "a.py", True),
        ("**/*.py", "src/deep/a.py", True),
        ("src/*.{py,ts}", "src/a.ts", True),
        ("src/*.{py,ts}", "src/a.js", False),
        ("?.md", "a.md", True),
        ("?.md", "ab.md", False),
        ("[ab].txt", "b.txt", True),
        ("[ab].txt", "c.txt", False),
        ("**/config", "config", True),
        ("**/config", "x/y/config", True),
        ("*", ".env", True),  # dotfiles match
    ],
)
def test_anchored(pattern: str, path: str, expected: bool) -> None:
    assert Globs([pattern]).match(path) is expected


def test_names_match_at_any_depth() -> None:
    include = Globs.names(["*.ts", "docs/*.md"])
    assert include.match("a/b/c.ts") and include.match("c.ts")
    assert include.match("docs/x.md") and not include.match("sub/docs/x.md")


def test_default_exclusions_cover_directories_and_contents() -> None:
    exclude = Globs(DEFAULT_EXCLUSIONS)
    assert exclude.match_dir("node_modules") and exclude.match_dir("a/node_modules")
    assert exclude.match("a/.git/HEAD") and exclude.match("__pycache__/x.pyc")
    assert not exclude.match_dir("src") and not exclude.match("src/app.py")


def test_empty_and_relative() -> None:
    assert not Globs([]) and not Globs([]).match("anything")
    assert relative("src/a/b.py", "src") == "a/b.py" and relative("x", "") == "x"


def test_exploding_brace_patterns_are_refused() -> None:
    with pytest.raises(QuillError) as info:
        Globs(["{a,b}" * 20])  # a million alternatives
    assert "Invalid glob pattern" in info.value.message


_name = st.text(alphabet="abc.-_", min_size=1, max_size=6).filter(lambda n: n not in (".", ".."))
"""Workspace names (``.`` and ``..`` never are: paths are normalised)."""


@given(st.lists(_name, min_size=1, max_size=4), _name)
def test_star_patterns_agree_with_fnmatch_within_one_segment(dirs: list[str], pattern: str) -> None:
    """For a single segment without braces or globstar, '*'/'?' mean what fnmatch means."""
    name = dirs[-1]
    pat = pattern.replace("-", "*").replace("_", "?")
    assert Globs([pat]).match(name) == fnmatch.fnmatchcase(name, pat)
