"""A change that changes nothing makes no version and says so (``committed: false``); a write
over a file says what it replaced (``previous_size``)."""

from __future__ import annotations

from contracts import replies as rp
from contracts import requests as rq
from tests.core.test_decide import Harness


def test_writing_identical_content_makes_no_version() -> None:
    h = Harness()
    first = h.run(rq.WriteFile(path="a.txt", content="hello\n"))
    assert isinstance(first.result, rp.FileWritten)
    assert (first.result.created, first.result.previous_size, first.result.committed) == (
        True,
        None,
        True,
    )
    version = h.state.version
    again = h.run(rq.WriteFile(path="a.txt", content="hello\n"))
    assert not again.commits and h.state.version == version
    r = again.result
    assert isinstance(r, rp.FileWritten)
    assert (r.committed, r.created, r.file_version, r.etag, r.size, r.previous_size) == (
        False,
        False,
        1,
        "v1",
        6,
        6,
    )
    assert r.modified == first.result.modified
    appended = h.run(rq.WriteFile(path="a.txt", content="", mode="append"))
    assert not appended.commits and isinstance(appended.result, rp.FileWritten)
    assert appended.result.committed is False


def test_a_write_over_a_file_gives_its_previous_size() -> None:
    h = Harness()
    h.run(rq.WriteFile(path="a.txt", content="x" * 10))
    replaced = h.run(rq.WriteFile(path="a.txt", content="short"))
    assert replaced.commits and isinstance(replaced.result, rp.FileWritten)
    r = replaced.result
    assert (r.created, r.previous_size, r.size, r.file_version, r.committed) == (
        False,
        10,
        5,
        2,
        True,
    )
    appended = h.run(rq.WriteFile(path="a.txt", content="!", mode="append"))
    assert isinstance(appended.result, rp.FileWritten)
    assert (appended.result.previous_size, appended.result.size) == (5, 6)


def test_modify_that_changes_nothing_makes_no_version() -> None:
    h = Harness()
    h.run(rq.WriteFile(path="f.txt", content="a\nb\n"))
    version = h.state.version
    for ops in (
        [rq.InsertLines(after_line=1, new_content="")],
        [rq.RegexReplace(pattern="a", replacement="a")],
        [rq.ReplaceLines(start_line=2, end_line=2, new_content="b")],
    ):
        d = h.run(rq.ModifyFile(path="f.txt", operations=list(ops)))
        assert isinstance(d.result, rp.FileModified)
        assert not d.commits and d.result.committed is False
        assert (d.result.file_version, d.result.etag) == (1, "v1")
    assert h.state.version == version and h.text("f.txt") == "a\nb\n"
    changed = h.run(
        rq.ModifyFile(path="f.txt", operations=[rq.InsertLines(after_line=0, new_content="z")])
    )
    assert changed.commits and isinstance(changed.result, rp.FileModified)
    assert changed.result.committed is True and changed.result.file_version == 2
