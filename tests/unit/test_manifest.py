"""A checkout's manifest on disk (``infra.exec.manifest``): what changed is appended, the whole
written again once the log is long, and a log cut short is an unreadable manifest."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from infra.exec.manifest import LOG, LOG_MIN, WHOLE, Manifest, Store, Tracked, watched


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
