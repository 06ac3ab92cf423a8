"""Glob semantics (one implementation for glob, include, exclude and ignore patterns)."""

from __future__ import annotations

import fnmatch
import re
import time
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from wcmatch import glob as wc

from contracts.errors import QuillError
from contracts.limits import DEFAULT_EXCLUSIONS
from core.finding import without_excluded
from core.globs import Globs, literal_directory, relative
from core.plan import LIVE
from core.rows import Node


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


# ---------------------------------------------------------------- the same meaning as wcmatch's

_TOKENS = st.sampled_from(
    ["a", "b", ".", "/", "*", "**", "?", "[", "]", "!", "^", "-", "{", "}", ",", "\\", ":"]
    + ["[:alpha:]", "[:punct:]", "é", "|", "&", "~", "0", "{1..3}"]
)
_SEGMENT = st.text(alphabet="ab.-![]^{},\\:é*?0", min_size=1, max_size=3).filter(
    lambda n: n not in (".", "..")
)


def _wcmatch(patterns: list[str]) -> re.Pattern[str] | None:
    """What ``wcmatch`` (the meaning Quill's globs keep) compiles ``patterns`` to; None for
    patterns it refuses."""
    flags = wc.GLOBSTAR | wc.BRACE | wc.DOTGLOB
    try:
        include, _ = wc.translate(patterns, flags=flags)
    except Exception:
        return None
    return re.compile("|".join(f"(?:{p})" for p in include))


def _instance(pattern: str, fill: list[str]) -> str:
    """A normalised path shaped like ``pattern`` (its wildcards filled from ``fill``), so
    that many paths match."""
    out = [fill[i % len(fill)] if c in "*?[]{}!^\\," else c for i, c in enumerate(pattern)]
    segments = [s or "x" for s in re.sub("/+", "/", "".join(out)).strip("/").split("/")]
    return "/".join("x" if s in (".", "..") else s for s in segments)


@settings(max_examples=400, deadline=None)
@given(
    st.lists(_TOKENS, min_size=1, max_size=8).map("".join),
    st.lists(st.lists(_SEGMENT, min_size=1, max_size=4).map("/".join), max_size=6),
    st.lists(st.sampled_from(["", "a", "ab", "a/b", ".", "-", "x/y/z"]), min_size=1),
    st.booleans(),
)
def test_globs_mean_what_wcmatch_means(
    pattern: str, paths: list[str], fill: list[str], trailing: bool
) -> None:
    """The linear-time translation matches exactly the normalised paths (and directory
    paths ending in ``/``, as ``match_dir`` asks) that wcmatch's regular expression does."""
    oracle = _wcmatch([pattern])
    if oracle is None:
        with pytest.raises(QuillError):
            Globs([pattern])
        return
    ours = Globs([pattern])
    for path in [*paths, _instance(pattern, fill)]:
        path += "/" if trailing else ""
        assert ours.match(path) == (oracle.match(path) is not None), (pattern, path)


def test_globs_take_linear_time() -> None:
    """A pattern wcmatch's backtracking regex took 10 s over for one 200-character path:
    each character of a longer path costs about what one of a shorter path did."""
    pattern = Globs(["**/a*/**/a*/**/a*/**/a*/**/b"])
    short, long = "a/" * 10 + "c", "a/" * 500 + "c"

    def cost(path: str) -> float:
        began = time.perf_counter()
        for _ in range(200):
            pattern.match(path)
        return (time.perf_counter() - began) / len(path)

    cost(short)  # warm
    assert cost(long) < 20 * cost(short)


def test_literal_directory() -> None:
    """The directories a pattern names before its first wildcard: a glob walks only them."""
    cases = {
        "pkg01/sub1/*.py": "pkg01/sub1",
        "src/**/x.ts": "src",
        "a/{b,c}/d": "a",
        "a/b": "a",  # the last segment is what is matched, found below a
        "a//b/c": "a",
        "a\\*/b/c": "",
        "**/*.py": "",
        "*.py": "",
        "./a/b": "",
    }
    assert {p: literal_directory(p) for p in cases} == cases


def test_an_excluded_directory_takes_what_it_holds_whatever_sorts_between() -> None:
    """``b-x`` sorts between ``b`` and ``b/x``: both excluded, ``b/x`` stays excluded."""
    at = datetime(2025, 1, 1, tzinfo=UTC)

    def node(path: str, kind: str) -> Node:
        return Node(path, kind, None, 0, None, False, False, at, at, 1, LIVE, None)

    nodes = [node("b", "d"), node("b-x", "d"), node("b-x/y", "f"), node("b/x", "f")]
    nodes += [node("c", "d"), node("c/b-x", "f")]
    kept = without_excluded(nodes, "", Globs(["b", "b-x"]))
    assert [n.path for n in kept] == ["c", "c/b-x"]
