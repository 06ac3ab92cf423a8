"""The three-way merge decision (``core.merge``): a table of cases for every rule and
strategy, applied to ours and checked; the bounds; what is read."""

from __future__ import annotations

import pytest

from contracts import hashing
from contracts.errors import ErrorCode, QuillError
from contracts.events import MakeDir, Remove
from core import merge
from core.merge import needs, plan
from core.merge_types import Dir, File, Put, Sides
from tests.core.merging import DIR, LABELS, Case, Tree

BASE = b"one\ntwo\nthree\nfour\nfive\nsix\nseven\n"
OURS_EDIT = b"ONE\ntwo\nthree\nfour\nfive\nsix\nseven\n"
THEIRS_EDIT = b"one\ntwo\nthree\nfour\nfive\nsix\nSEVEN\n"
BOTH = b"ONE\ntwo\nthree\nfour\nfive\nsix\nSEVEN\n"
OURS_4 = b"one\ntwo\nthree\nFOUR-ours\nfive\nsix\nseven\n"
THEIRS_4 = b"one\ntwo\nthree\nFOUR-theirs\nfive\nsix\nseven\n"
PNG = b"\x89PNG\r\n\x1a\n\0\0"


def sha(data: bytes) -> str:
    return hashing.content_sha256(data)


# ---------------------------------------------------------------- one side, both the same


def test_a_path_changed_on_their_side_only_is_taken_without_reading_it() -> None:
    case = Case({"a.txt": BASE, "b.txt": b"b\n"}, {"a.txt": BASE, "b.txt": b"b\n"},
                {"a.txt": THEIRS_EDIT, "b.txt": b"b\n", "new/c.txt": b"c\n"})  # fmt: skip
    p = case.plan()
    assert p.refused is None and p.conflicts == []
    assert p.changes == [
        Put(path="a.txt", sha256=sha(THEIRS_EDIT), size=len(THEIRS_EDIT), source="theirs"),
        MakeDir(path="new"),
        Put(path="new/c.txt", sha256=sha(b"c\n"), size=2, source="theirs"),
    ]
    assert case.read == []
    assert case.merged() == case.theirs


def test_a_path_changed_on_our_side_only_stays_and_nothing_is_done() -> None:
    case = Case({"a.txt": BASE}, {"a.txt": OURS_EDIT, "x": DIR}, {"a.txt": BASE})
    p = case.plan()
    assert (p.changes, p.conflicts, case.read) == ([], [], [])


def test_the_same_change_on_both_sides_is_taken_once_without_a_conflict() -> None:
    case = Case({"a.txt": BASE, "gone": b"x"}, {"a.txt": BOTH, "d/n": b"n"},
                {"a.txt": BOTH, "d/n": b"n"})  # fmt: skip
    p = case.plan()
    assert (p.changes, p.conflicts, case.read) == ([], [], [])


def test_both_sides_removing_a_file_agree_and_a_directory_made_there_is_taken() -> None:
    case = Case({"p": b"file\n"}, {}, {"p/inner.txt": b"i\n"})
    assert case.merged() == case.theirs and case.plan().conflicts == []


def nothing(sha256: str) -> bytes | None:
    raise AssertionError(f"{sha256} read")


def test_a_path_given_that_no_side_changed_is_dropped() -> None:
    row = Sides("same.txt", File(sha256=sha(BASE), size=1), File(sha256=sha(BASE), size=1),
                File(sha256=sha(BASE), size=1))  # fmt: skip
    p = plan([row], "fail", nothing, labels=LABELS, max_file_bytes=10)
    assert (p.changes, p.conflicts) == ([], [])


# ---------------------------------------------------------------- texts changed on both sides


def test_texts_changed_on_both_sides_in_different_places_merge_line_by_line() -> None:
    case = Case({"a.txt": BASE}, {"a.txt": OURS_EDIT}, {"a.txt": THEIRS_EDIT})
    p = case.plan()
    assert p.refused is None and p.conflicts == [] and p.merged == ["a.txt"]
    assert p.changes == [
        Put(path="a.txt", sha256=sha(BOTH), size=len(BOTH), data=BOTH, source="merged")
    ]
    assert sorted(case.read) == sorted({sha(BASE), sha(OURS_EDIT), sha(THEIRS_EDIT)})
    assert set(needs(case.sides())) == set(case.read)


def test_overlapping_hunks_conflict_and_fail_commits_nothing_listing_a_three_way_view() -> None:
    case = Case({"a.txt": BASE}, {"a.txt": OURS_4}, {"a.txt": THEIRS_4})
    p = case.plan("fail")
    assert p.changes == [] and p.refused and "1 conflict" in p.refused
    [c] = p.conflicts
    assert (c.path, c.kind, c.resolution, c.hunks_total) == ("a.txt", "content", None, 1)
    assert c.ours == File(sha256=sha(OURS_4), size=len(OURS_4))
    assert c.theirs == File(sha256=sha(THEIRS_4), size=len(THEIRS_4))
    [h] = c.hunks
    assert (h.base_line, h.ours_line, h.theirs_line) == (4, 4, 4)
    assert (h.base, h.ours, h.theirs, h.cut) == ("four\n", "FOUR-ours\n", "FOUR-theirs\n", False)


@pytest.mark.parametrize("side", ["ours", "theirs"])
def test_ours_and_theirs_decide_each_conflicting_hunk_and_keep_the_rest(side: str) -> None:
    base = BASE
    ours = OURS_4.replace(b"one", b"ONE")
    theirs = THEIRS_4.replace(b"seven", b"SEVEN")
    case = Case({"a.txt": base}, {"a.txt": ours}, {"a.txt": theirs})
    p = case.plan(side)  # type: ignore[arg-type]
    assert p.refused is None and [c.resolution for c in p.conflicts] == [side]
    word = b"FOUR-ours" if side == "ours" else b"FOUR-theirs"
    expected = b"ONE\ntwo\nthree\n" + word + b"\nfive\nsix\nSEVEN\n"
    assert case.merged(side) == {"a.txt": expected}  # type: ignore[arg-type]


def test_markers_write_gits_conflict_markers_naming_workspaces_and_versions() -> None:
    case = Case({"a.txt": BASE}, {"a.txt": OURS_4}, {"a.txt": THEIRS_4.replace(b"one", b"1")})
    p = case.plan("markers")
    assert p.refused is None and p.marked == ["a.txt"] and p.conflicts[0].resolution == "markers"
    assert case.merged("markers")["a.txt"] == (
        b"1\ntwo\nthree\n<<<<<<< main@12\nFOUR-ours\n||||||| main@7\nfour\n=======\n"
        b"FOUR-theirs\n>>>>>>> fork@15\nfive\nsix\nseven\n"
    )
    assert case.merged("markers", style="merge")["a.txt"] == (
        b"1\ntwo\nthree\n<<<<<<< main@12\nFOUR-ours\n=======\nFOUR-theirs\n>>>>>>> fork@15\n"
        b"five\nsix\nseven\n"
    )


def test_line_endings_and_a_missing_final_newline_survive_a_clean_merge() -> None:
    base = b"a\r\nb\r\nc\r\nd\r\ne"
    ours = b"A\r\nb\r\nc\r\nd\r\ne"
    theirs = b"a\r\nb\r\nc\r\nd\r\nE"
    case = Case({"w.txt": base}, {"w.txt": ours}, {"w.txt": theirs})
    assert case.merged() == {"w.txt": b"A\r\nb\r\nc\r\nd\r\nE"}


def test_markers_in_a_crlf_file_end_in_crlf_and_a_side_without_final_newline_gets_one() -> None:
    case = Case({"w": b"a\r\nb"}, {"w": b"a\r\nB"}, {"w": b"a\r\nC"})
    assert case.merged("markers", style="merge")["w"] == (
        b"a\r\n<<<<<<< main@12\r\nB\r\n=======\r\nC\r\n>>>>>>> fork@15\r\n"
    )


def test_the_executable_bit_merges_three_way() -> None:
    case = Case({"run.sh": BASE}, {"run.sh": ("x", BASE)}, {"run.sh": THEIRS_EDIT})
    assert case.merged() == {"run.sh": ("x", THEIRS_EDIT)}
    only_mode = Case({"run.sh": BASE}, {"run.sh": ("x", BASE)}, {"run.sh": BASE})
    assert only_mode.plan().changes == []
    theirs_mode = Case({"run.sh": BASE}, {"run.sh": BASE}, {"run.sh": ("x", BASE)})
    assert theirs_mode.plan().changes == [
        Put(path="run.sh", sha256=sha(BASE), size=len(BASE), executable=True, source="ours")
    ]


# ---------------------------------------------------------------- whole-file conflicts


def test_binary_files_changed_on_both_sides_conflict_without_being_read() -> None:
    case = Case({"i.png": PNG}, {"i.png": PNG + b"o"}, {"i.png": PNG + b"t"})
    p = case.plan()
    assert [(c.kind, c.hunks) for c in p.conflicts] == [("binary", [])] and p.changes == []
    assert case.read == [] and needs(case.sides()) == []
    assert case.merged("ours") == case.ours and case.merged("theirs") == case.theirs
    refused = case.plan("markers")
    assert refused.changes == [] and refused.refused and "binary" in refused.refused


@pytest.mark.parametrize("deleted", ["ours", "theirs"])
def test_delete_against_modify_conflicts_and_each_side_wins_whole(deleted: str) -> None:
    gone: Tree = {"keep": b"k"}
    changed: Tree = {"keep": b"k", "d/f.txt": THEIRS_EDIT}
    ours, theirs = (gone, changed) if deleted == "ours" else (changed, gone)
    case = Case({"keep": b"k", "d/f.txt": BASE}, ours, theirs)
    p = case.plan()
    assert [(c.path, c.kind) for c in p.conflicts] == [("d/f.txt", "delete_modify")]
    assert case.read == []
    assert case.merged("ours") == case.ours and case.merged("theirs") == case.theirs
    assert case.plan("markers").refused


def test_a_directory_removed_on_one_side_stays_for_a_file_the_other_side_added_in_it() -> None:
    case = Case({"d/a": b"a", "d/b": b"b"}, {}, {"d/a": b"a", "d/b": b"b", "d/new": b"n"})
    assert case.merged() == {"d": DIR, "d/new": b"n"} and case.plan().conflicts == []


@pytest.mark.parametrize("file_side", ["ours", "theirs"])
def test_a_file_against_a_directory_with_changes_below_conflicts_with_those_paths(
    file_side: str,
) -> None:
    as_file: Tree = {"p": b"a file\n"}
    as_dir: Tree = {"p/a.txt": b"a\n", "p/sub/b.txt": b"b\n"}
    ours, theirs = (as_file, as_dir) if file_side == "ours" else (as_dir, as_file)
    case = Case({}, ours, theirs)
    p = case.plan()
    [c] = p.conflicts
    assert (c.path, c.kind, c.paths, c.paths_total) == (
        "p", "file_directory", ["p/a.txt", "p/sub", "p/sub/b.txt"], 3,
    )  # fmt: skip
    assert isinstance(c.ours if file_side == "theirs" else c.theirs, Dir)
    assert case.merged("ours") == case.ours and case.merged("theirs") == case.theirs
    assert case.plan("markers").refused


def test_a_file_replacing_a_directory_the_other_side_left_alone_is_taken() -> None:
    case = Case({"p/a": b"a"}, {"p/a": b"a"}, {"p": b"now a file"})
    assert case.merged() == case.theirs and case.plan().conflicts == []
    p = case.plan()
    assert [type(c).__name__ for c in p.changes] == ["Remove", "Put"]


def test_a_file_replacing_a_directory_the_other_side_changed_below_conflicts() -> None:
    case = Case({"p/a": b"a"}, {"p/a": b"a changed"}, {"p": b"now a file"})
    [c] = case.plan().conflicts
    assert (c.path, c.kind, c.paths) == ("p", "file_directory", ["p/a"])
    assert case.merged("theirs") == case.theirs and case.merged("ours") == case.ours


def test_two_new_files_conflict_as_add_add_and_markers_merge_them_from_an_empty_base() -> None:
    case = Case({}, {"n.txt": b"ours\n"}, {"n.txt": b"theirs\n"})
    [c] = case.plan().conflicts
    assert c.kind == "add_add" and c.base is None
    assert case.merged("markers")["n.txt"] == (
        b"<<<<<<< main@12\nours\n||||||| main@7\n=======\ntheirs\n>>>>>>> fork@15\n"
    )
    assert case.merged("theirs") == case.theirs


def test_two_new_files_alike_but_for_the_executable_bit_are_a_mode_conflict() -> None:
    case = Case({}, {"n.sh": ("x", b"run\n")}, {"n.sh": b"run\n"})
    assert [c.kind for c in case.plan().conflicts] == ["mode"]
    assert case.plan("markers").refused
    assert case.merged("theirs") == case.theirs and case.merged("ours") == case.ours


# ---------------------------------------------------------------- bounds and errors


def test_a_merged_file_over_the_targets_limit_is_refused() -> None:
    case = Case({"a.txt": BASE}, {"a.txt": OURS_EDIT}, {"a.txt": THEIRS_EDIT})
    with pytest.raises(QuillError) as err:
        case.plan(max_file_bytes=len(BOTH) - 1)
    assert err.value.code == ErrorCode.SIZE_LIMIT_EXCEEDED and err.value.details["path"] == "a.txt"
    big = Case({}, {}, {"big.bin": b"x" * 100})
    with pytest.raises(QuillError) as err:
        big.plan(max_file_bytes=99)
    assert err.value.details == {"path": "big.bin", "size": 100, "max_file_bytes": 99}


def test_a_conflicts_view_is_bounded() -> None:
    base = b"".join(b"line %d\n" % i for i in range(200))
    ours = base.replace(b"line 1", b"ours 1").replace(b"line 5", b"ours 5" + b"x" * 5000)
    for i in range(10, 200, 4):
        ours = ours.replace(b"line %d\n" % i, b"ours %d\n" % i)
    theirs = ours.replace(b"ours", b"theirs")
    case = Case({"a": base}, {"a": ours}, {"a": theirs})
    [c] = case.plan().conflicts
    assert c.hunks_total > merge.VIEW_HUNKS == len(c.hunks)
    long = [h for h in c.hunks if h.cut]
    assert long and all(len(h.ours.encode()) <= merge.VIEW_SIDE_BYTES for h in c.hunks)


def test_out_of_time_the_merge_stops_as_too_large_to_merge_here() -> None:
    case = Case({"a.txt": BASE}, {"a.txt": OURS_EDIT}, {"a.txt": THEIRS_EDIT})
    with pytest.raises(QuillError) as err:
        case.plan(remaining=lambda: 0.0)
    assert err.value.code == ErrorCode.SIZE_LIMIT_EXCEEDED
    assert err.value.details["reason"] == "merge_budget"


def test_bad_input_is_a_clear_error() -> None:
    row = Sides("a", None, Dir(), None)
    for rows, strategy in (
        ([row, row], "fail"),
        ([row], "union"),
        ([Sides("", None, Dir(), None)], "fail"),
    ):
        with pytest.raises(QuillError) as err:
            plan(rows, strategy, nothing, labels=LABELS, max_file_bytes=1)  # type: ignore[arg-type]
        assert err.value.code == ErrorCode.INVALID_ARGUMENT
    case = Case({"a.txt": BASE}, {"a.txt": OURS_EDIT}, {"a.txt": THEIRS_EDIT})
    case.store.clear()
    with pytest.raises(QuillError) as err:
        case.plan()
    assert err.value.code == ErrorCode.UNAVAILABLE


def test_a_removed_directory_takes_its_contents_in_one_change() -> None:
    case = Case({"d/a": b"a", "d/e/b": b"b"}, {"d/a": b"a", "d/e/b": b"b"}, {})
    assert case.plan().changes == [Remove(path="d")] and case.merged() == {}
