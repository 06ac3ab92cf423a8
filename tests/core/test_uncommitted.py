"""The paths left uncommitted, as the log records them: one fold (writer state, executor
checkout) and one plan (the SQLite projection) that agree, whatever the batch."""

from __future__ import annotations

from datetime import UTC, datetime

from contracts.events import ChangesCommitted, MakeDir, PutFile, Remove, UncommittedPath
from contracts.uncommitted import Recorded, capped, command_of, fold_uncommitted, lookup
from core.plan import Committed, plan

AT = datetime(2026, 1, 1, tzinfo=UTC)


def event(version: int, changes: list[object], left: list[str] | None = None) -> ChangesCommitted:
    return ChangesCommitted(
        tenant="t", workspace="w", version=version, at=AT, op="apply",
        request_id=f"cmd{version}:changes", prev_hash="", tree_hash="",
        changes=changes,  # type: ignore[arg-type]
        uncommitted=None if left is None else [UncommittedPath(path=p, reason="r") for p in left],
    )  # fmt: skip


def put(path: str) -> PutFile:
    return PutFile(path=path, sha256="0" * 64, size=0, file_version=1, created=AT)


def planned(events: list[ChangesCommitted]) -> dict[str, tuple[str, str, int]]:
    """What the projection holds after ``events`` applied as one batch to an empty set."""
    p = plan([Committed(e, "h", e.version) for e in events], {("t", "w"): 1})
    rows = {r[0]: (r[1], r[2], r[3]) for r in p.uncommitted_sets.get(1, [])}
    return rows


def folded(events: list[ChangesCommitted]) -> dict[str, tuple[str, str, int]]:
    recorded: dict[str, Recorded] = {}
    for e in events:
        fold_uncommitted(recorded, e)
    return {p: tuple(r) for p, r in recorded.items()}  # type: ignore[misc]


def test_fold_and_plan_agree() -> None:
    cases = [
        [event(2, [], ["big.bin", "d/link", "x"])],
        [event(2, [], ["big.bin", "d/link", "x"]), event(3, [put("big.bin")])],
        [event(2, [], ["big.bin", "d/link", "x"]), event(3, [Remove(path="d")])],
        [event(2, [], ["big.bin", "d/link"]), event(3, [MakeDir(path="d/link")])],
        [event(2, [], ["a"]), event(3, [put("a")]), event(4, [], ["a", "b"])],
        [event(2, [], ["a", "b"]), event(3, [], [])],
    ]
    for events in cases:
        assert planned(events) == folded(events), events
    assert folded(cases[1]) == {"d/link": ("r", "cmd2", 2), "x": ("r", "cmd2", 2)}
    assert folded(cases[2]) == {"big.bin": ("r", "cmd2", 2), "x": ("r", "cmd2", 2)}
    assert folded(cases[5]) == {}


def test_a_batch_without_a_set_clears_by_range() -> None:
    p = plan([Committed(event(5, [put("a"), Remove(path="d")]), "h", 5)], {("t", "w"): 1})
    assert p.uncommitted_sets == {}
    assert p.uncommitted_clears == [(1, "a", "a\0"), (1, "d", "d\0"), (1, "d/", "d0")]


def test_lookup_names_the_path_or_its_parent() -> None:
    recorded = {"l": Recorded("symlink", "c", 2)}
    assert lookup(recorded, "l") == ("l", recorded["l"])
    assert lookup(recorded, "l/x/y") == ("l", recorded["l"])
    assert lookup(recorded, "lx") is None


def test_capped_and_command_of() -> None:
    many = [UncommittedPath(path=f"f{i:05}", reason="symlink") for i in range(3000, 0, -1)]
    kept = capped(many)
    assert len(kept) == 1000 and kept[0].path == "f00001"
    huge = [UncommittedPath(path=f"{i}" + "x" * 4000, reason="r") for i in range(100)]
    assert sum(len(u.path) for u in capped(huge)) <= 64 * 1024
    assert command_of("abc:changes") == "abc" and command_of("xdeadbeef") == "xdeadbeef"
