"""Properties of the line-by-line merge (``core.diff3``, through ``core.merge.plan``), and
``git merge-file`` as the reference: where git merges cleanly, the bytes are git's."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from contracts.paths import ancestors
from core.content import split_lines
from core.diff3 import chunks, conflicts, marked, resolved
from core.merge_types import File, Strategy, same
from tests.core.merging import DIR, LABELS, Case, Tree, apply, entry

WORDS = st.sampled_from(["a", "b", "c", "", "x y", "}", "é"])
"""Few distinct lines: repeats make the matching ambiguous, as in real code."""


@st.composite
def text(draw: st.DrawFn, lines: st.SearchStrategy[str] = WORDS) -> str:
    eol = draw(st.sampled_from(["\n", "\r\n"]))
    body = "".join(line + eol for line in draw(st.lists(lines, max_size=12)))
    return body[: -len(eol)] if body and draw(st.booleans()) else body


@st.composite
def edited(draw: st.DrawFn, base: str) -> str:
    """``base`` with some lines removed, replaced or added."""
    out: list[str] = []
    for line in split_lines(base):
        op = draw(st.sampled_from(["keep", "keep", "keep", "drop", "swap", "add"]))
        if op in ("swap", "add"):
            out.append(draw(WORDS) + "\n")
        if op in ("keep", "add"):
            out.append(line)
    if draw(st.booleans()):
        out.append(draw(WORDS) + "\n")
    return "".join(out)


def merged_text(base: str, ours: str, theirs: str, strategy: Strategy, **kw: object) -> bytes:
    case = Case({"f": base.encode()}, {"f": ours.encode()}, {"f": theirs.encode()})
    tree = case.merged(strategy, **kw)
    node = tree["f"]
    assert isinstance(node, bytes)
    return node


@settings(max_examples=200)
@given(st.data())
def test_merging_with_an_unchanged_side_gives_the_other_side_exactly(data: st.DataObject) -> None:
    base = data.draw(text())
    other = data.draw(st.one_of(text(), edited(base)))
    for ours, theirs in ((base, other), (other, base)):
        merged = chunks(split_lines(base), split_lines(ours), split_lines(theirs))
        assert conflicts(merged) == []
        assert resolved(merged, "ours") == other
    assume(other != base)
    assert merged_text(base, base, other, "fail") == other.encode()


@settings(max_examples=200)
@given(st.data())
def test_the_same_change_on_both_sides_is_that_change_without_a_conflict(
    data: st.DataObject,
) -> None:
    base = data.draw(text())
    x = data.draw(st.one_of(text(), edited(base)))
    merged = chunks(split_lines(base), split_lines(x), split_lines(x))
    assert conflicts(merged) == [] and resolved(merged, "theirs") == x


def parse(marked_text: str, side: str) -> str:
    """A text written with markers, read back as one side wrote it (the base section
    skipped)."""
    out, where = [], "both"
    for line in split_lines(marked_text):
        if line.startswith("<<<<<<< "):
            where = "ours"
        elif line.startswith("||||||| "):
            where = "base"
        elif line.rstrip("\r\n") == "=======" and where in ("ours", "base"):
            where = "theirs"
        elif line.startswith(">>>>>>> "):
            where = "both"
        elif where in ("both", side):
            out.append(line)
    return "".join(out)


@settings(max_examples=200)
@given(st.data())
def test_ours_and_theirs_pick_their_side_on_each_hunk_and_markers_read_back_as_both(
    data: st.DataObject,
) -> None:
    base = data.draw(text()).replace("\r", "")
    if base and not base.endswith("\n"):
        base += "\n"  # a side without a final newline gets one inside the markers
    ours, theirs = data.draw(edited(base)), data.draw(edited(base))
    assume(len({base, ours, theirs}) == 3)
    lines = split_lines(base), split_lines(ours), split_lines(theirs)
    merged = chunks(*lines)
    picked = {}
    for side in ("ours", "theirs"):
        case = Case({"f": base.encode()}, {"f": ours.encode()}, {"f": theirs.encode()})
        p = case.plan(side)
        assert p.refused is None
        assert all(c.resolution == side for c in p.conflicts)
        picked[side] = merged_text(base, ours, theirs, side)
        assert picked[side] == resolved(merged, side).encode()
    for style in ("diff3", "merge"):
        with_markers = merged_text(base, ours, theirs, "markers", style=style).decode()
        assert parse(with_markers, "ours").encode() == picked["ours"]
        assert parse(with_markers, "theirs").encode() == picked["theirs"]
    if not conflicts(merged):
        assert picked["ours"] == picked["theirs"]


@settings(max_examples=200)
@given(st.data())
def test_edits_on_both_sides_apart_both_appear(data: st.DataObject) -> None:
    n = data.draw(st.integers(3, 15))
    base = [f"line {i}\n" for i in range(n)]
    k = data.draw(st.integers(1, n - 2))
    fresh = iter(f"new {i}\n" for i in range(1000))

    def edit(part: list[str]) -> list[str]:
        out = []
        for line in part:
            op = data.draw(st.sampled_from(["keep", "drop", "swap", "add"]))
            out += [next(fresh)] if op in ("swap", "add") else []
            out += [line] if op in ("keep", "add") else []
        return out + ([next(fresh)] if data.draw(st.booleans()) else [])

    ours_head, theirs_tail = edit(base[:k]), edit(base[k + 1 :])
    ours = "".join(ours_head + base[k:])
    theirs = "".join(base[: k + 1] + theirs_tail)
    expected = "".join(ours_head + [base[k]] + theirs_tail)
    assert merged_text("".join(base), ours, theirs, "fail") == expected.encode()


# ---------------------------------------------------------------- against git merge-file

GIT = shutil.which("git")


def git_merge(base: bytes, ours: bytes, theirs: bytes) -> tuple[int, bytes]:
    with tempfile.TemporaryDirectory() as tmp:
        for name, content in (("base", base), ("ours", ours), ("theirs", theirs)):
            (Path(tmp) / name).write_bytes(content)
        labels = ["-L", LABELS.ours, "-L", LABELS.base, "-L", LABELS.theirs]
        done = subprocess.run(
            [GIT or "git", "merge-file", "-p", "--diff3", *labels, "ours", "base", "theirs"],
            cwd=tmp,
            capture_output=True,
            check=False,
        )
    assert done.returncode >= 0, done.stderr
    return done.returncode, done.stdout


@st.composite
def unique_case(draw: st.DrawFn) -> tuple[bytes, bytes, bytes]:
    """Three files of distinct lines (each new line new; one side may copy the other's
    edit): the matching is not ambiguous, so git's diff and difflib's agree."""
    base = [f"b{i}" for i in range(draw(st.integers(0, 12)))]
    fresh = iter(range(10_000))

    def edit(lines: list[str], who: str) -> list[str]:
        out = []
        for line in lines:
            op = draw(st.sampled_from(["keep", "keep", "keep", "drop", "swap", "add"]))
            out += [f"{who}{next(fresh)}"] if op in ("swap", "add") else []
            out += [line] if op in ("keep", "add") else []
        return out + ([f"{who}{next(fresh)}"] if draw(st.booleans()) else [])

    ours = edit(base, "o")
    theirs = ours if draw(st.integers(0, 9)) == 0 else edit(base, "t")
    eol = draw(st.sampled_from(["\n", "\r\n"]))

    def join(lines: list[str]) -> bytes:
        body = "".join(line + eol for line in lines)
        return (body[: -len(eol)] if body and draw(st.booleans()) else body).encode()

    return join(base), join(ours), join(theirs)


@pytest.mark.skipif(GIT is None, reason="git is not installed: no reference to compare with")
@settings(max_examples=300)
@given(unique_case())
def test_where_git_merges_cleanly_the_merge_is_gits_byte_for_byte(
    files: tuple[bytes, bytes, bytes],
) -> None:
    base, ours, theirs = files
    code, out = git_merge(base, ours, theirs)
    b, o, t = (split_lines(f.decode()) for f in files)
    merged = chunks(b, o, t)
    if code == 0:
        assert conflicts(merged) == []
        assert resolved(merged, "ours").encode() == out
        if len({base, ours, theirs}) == 3:
            assert merged_text(base.decode(), ours.decode(), theirs.decode(), "fail") == out
    else:  # and its conflicts too, markers and all
        assert len(conflicts(merged)) == code
        assert marked(b, o, t, merged, LABELS).encode() == out


def test_the_git_comparison_can_fail() -> None:
    if GIT is None:
        pytest.skip("git is not installed: no reference to compare with")
    code, out = git_merge(b"a\nb\nc\n", b"A\nb\nc\n", b"a\nb\nC\n")
    assert (code, out) == (0, b"A\nb\nC\n")
    merged = chunks(*(split_lines(t) for t in ("a\nb\nc\n", "A\nb\nc\n", "a\nB\nc\n")))
    assert len(conflicts(merged)) == 1  # touching changes conflict, as in git
    assert git_merge(b"a\nb\nc\n", b"A\nb\nc\n", b"a\nB\nc\n")[0] == 1


# ---------------------------------------------------------------- whole trees

UNIVERSE = ["a", "a/b", "a/b/c", "a/d", "e", "e/f"]
NODES = st.sampled_from(
    [None, None, DIR, DIR, DIR, b"1\n2\n3\n", b"1\nX\n3\n", b"1\n2\nY\n", b"\0bin",
     ("x", b"1\n2\n3\n")]
)  # fmt: skip


@st.composite
def trees(draw: st.DrawFn) -> Tree:
    """A small tree over ``UNIVERSE``: below a file or nothing, nothing."""
    tree: Tree = {}
    for path in UNIVERSE:
        if all(tree.get(a) == DIR for a in ancestors(path)):
            node = draw(NODES)
            if node is not None:
                tree[path] = node
    return tree


@settings(max_examples=1000)
@given(trees(), trees(), trees(), st.sampled_from(["fail", "ours", "theirs", "markers"]))
def test_a_plan_applies_to_ours_and_takes_every_change_made_on_one_side_only(
    base: Tree, ours: Tree, theirs: Tree, strategy: Strategy
) -> None:
    case = Case(base, ours, theirs)
    p = case.plan(strategy)
    if strategy in ("ours", "theirs"):
        assert p.refused is None and all(c.resolution == strategy for c in p.conflicts)
    if p.refused is not None:
        assert p.changes == [] and any(c.resolution is None for c in p.conflicts)
        return
    result = apply(case.ours, p, case.store)  # each change checked to apply, in order
    roots = {c.path for c in p.conflicts}
    for path in {*case.base, *case.ours, *case.theirs}:
        if any(a in roots for a in [*ancestors(path), path]):
            continue
        b, o, t = (entry(tree.get(path)) for tree in (case.base, case.ours, case.theirs))
        r = entry(result.get(path))
        if isinstance(o, File) and same(t, b) and not same(o, b):
            assert same(r, o), path
        if isinstance(t, File) and same(o, b) and not same(t, b):
            assert same(r, t), path
    if case.ours == case.base:
        assert result == case.theirs
    if case.theirs == case.base or case.theirs == case.ours:
        assert p.changes == [] and p.conflicts == []
