"""A checkout's manifest on disk (``infra.exec.manifest``): what changed is appended, the whole
written again once the log is long, and a log cut short is an unreadable manifest."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from infra.exec.manifest import LOG, LOG_MIN, WHOLE, Manifest, PathMap, Store, Tracked, watched


def saved(home: Path) -> tuple[Store, Manifest]:
    store = Store(home)
    manifest = watched(Manifest(present_known=True))
    for n in range(1000):
        manifest.paths[f"d/f{n}.txt"] = Tracked("a" * 64, False, (1, 2, 3, n))
    store.save(manifest)
    return store, manifest


def test_a_change_is_appended_and_read_back(tmp_path: Path) -> None:
    store, manifest = saved(tmp_path)
    whole = (tmp_path / WHOLE).stat().st_size
    manifest.paths["d/f7.txt"] = Tracked("b" * 64, True, (9, 9, 9, 9))
    del manifest.paths["d/f8.txt"]
    manifest.local["x.lnk"] = (0, 1, 2, 3)
    manifest.present["x.lnk"] = ("x.lnk", "symlink")
    manifest.ignored.append("node_modules")
    manifest.version, manifest.seq = 5, 50
    store.save(manifest)
    assert (tmp_path / WHOLE).stat().st_size == whole  # not rewritten
    assert 0 < (tmp_path / LOG).stat().st_size < 1000
    again = Store(tmp_path).load()
    assert again == manifest and isinstance(again.paths, dict)
    assert "d/f8.txt" not in again.paths and again.paths["d/f7.txt"].executable
    assert again.ignored == ["node_modules"] and again.version == 5


def test_a_long_log_is_folded_into_the_whole(tmp_path: Path) -> None:
    store, manifest = saved(tmp_path)
    for round_ in range(LOG_MIN // 50 + 10):
        manifest.paths["d/f1.txt"] = Tracked("c" * 64, False, (round_, 0, 0, 0))
        store.save(manifest)
    log = tmp_path / LOG  # ~3 MB of frames written: folded at least once
    assert not log.exists() or log.stat().st_size <= LOG_MIN + 1024
    assert Store(tmp_path).load() == manifest


def test_a_log_cut_short_is_unreadable(tmp_path: Path) -> None:
    store, manifest = saved(tmp_path)
    manifest.paths["d/new.txt"] = Tracked("d" * 64)
    store.save(manifest)
    log = tmp_path / LOG
    log.write_bytes(log.read_bytes()[:-3])
    with pytest.raises(msgspec.DecodeError):
        Store(tmp_path).load()


def test_a_manifest_written_before_the_log_reads_as_not_knowing_what_is_uncommitted(
    tmp_path: Path,
) -> None:
    old = {"version": 3, "seq": 9, "paths": {"a.txt": ["e" * 64, False, None]}, "ignored": []}
    (tmp_path / WHOLE).write_bytes(msgspec.msgpack.encode(old))
    loaded = Store(tmp_path).load()
    assert loaded.version == 3 and not loaded.present_known and loaded.present == {}


def naive_holds(paths: dict[str, Tracked], rel: str) -> bool:
    tracked = paths.get(rel)
    return (tracked is not None and tracked.sha256 is None) or any(
        p.startswith(rel + "/") for p in paths
    )


_DIR = Tracked(None)
_FILE = Tracked("a" * 64)
_names = st.sampled_from(["a", "b", "a/b", "a/c", "a/b/c", "b/a", "a/b/c/d", "c"])


@given(
    st.lists(st.tuples(st.booleans(), _names, st.booleans()), max_size=40),
    st.integers(0, 40),
)
def test_path_map_knows_what_lies_below_a_directory_as_paths_come_and_go(
    ops: list[tuple[bool, str, bool]], ask_from: int
) -> None:
    """``holds`` answers as a scan of the map would, whether its counts were built before the
    changes (then kept up) or after them; ``pop``, ``del`` and ``clear`` included."""
    paths = PathMap({"a/z": _FILE})
    for n, (put, name, is_dir) in enumerate(ops):
        if n == ask_from:
            paths.holds("a")  # the counts are built here, then kept
        if put:
            paths[name] = _DIR if is_dir else _FILE
        elif n % 3 == 0:
            paths.pop(name, None)
        elif name in paths:
            del paths[name]
        if n == 20:
            paths.clear()
    for rel in ["a", "b", "a/b", "a/b/c", "c", "a/z", "z"]:
        assert paths.holds(rel) == naive_holds(dict(paths), rel), rel


def test_path_map_pays_for_what_changed_not_for_the_tree(monkeypatch: pytest.MonkeyPatch) -> None:
    """After the first question, a change of one path and a question cost that path's depth:
    the 10,000 paths of the map are not walked again (counted through ``ancestors``)."""
    import infra.exec.manifest as module

    paths = PathMap({f"d{n % 100}/f{n}.txt": _FILE for n in range(10_000)})
    assert paths.holds("d7") and not paths.holds("e")
    calls = 0
    real = module.ancestors

    def counted(path: str) -> list[str]:
        nonlocal calls
        calls += 1
        return real(path)

    monkeypatch.setattr(module, "ancestors", counted)
    for n in range(50):
        paths[f"new/x{n}.txt"] = _FILE
        assert paths.holds("new")
        paths.pop(f"new/x{n}.txt")
        assert not paths.holds("new")
    assert calls == 100
