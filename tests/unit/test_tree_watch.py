"""``infra.exec.watch.TreeWatch`` on its own: what it says changed and what it says the tree
holds, against a walk (``services.executor.quota.held``) after each kind of change, and each
fallback (an overflow, a watch it may not add) forced and found to miss nothing."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.exec.watch import TreeWatch
from services.executor import quota


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "tree"
    (root / "src" / "deep").mkdir(parents=True)
    for n in range(20):
        (root / "src" / f"f{n}.txt").write_text(f"{n}\n")
    (root / "src" / "deep" / "x.txt").write_text("x\n")
    (root / "top.txt").write_text("top\n")
    return root


def sh(tree: Path, script: str) -> None:
    subprocess.run(["bash", "-c", script], cwd=tree, check=True)


@contextlib.contextmanager
def armed(tree: Path, max_watches: int | None = None) -> Iterator[TreeWatch]:
    """A watch on ``tree``, armed and taken once (what changed before it is not known),
    closed after."""
    watch = TreeWatch(tree) if max_watches is None else TreeWatch(tree, max_watches=max_watches)
    watch.arm()
    watch.take()
    try:
        yield watch
    finally:
        watch.close()


def taken(watch: TreeWatch) -> dict[str, str]:
    dirty = watch.take()
    assert dirty is not None, watch.why
    return dict(dirty)


def test_it_lists_what_changed_and_keeps_the_size(tree: Path) -> None:
    watch = TreeWatch(tree)
    assert watch.arm() == quota.held(tree)
    assert watch.take() is None  # armed: what changed before is not known
    try:
        sh(tree, "echo y >> src/f1.txt && rm src/f2.txt && mkdir -p new/a/b && "
                 "echo n > new/a/b/n.txt && mv src/deep moved && chmod +x top.txt && "
                 "head -c 100000 /dev/zero > big.bin && ln -s top.txt link")  # fmt: skip
        assert taken(watch) == {
            "src/f1.txt": "all",
            "src/f2.txt": "gone",
            "new": "all",
            "src/deep": "gone",
            "moved": "all",
            "top.txt": "all",
            "big.bin": "all",
            "link": "all",
        }
        assert watch.held() == quota.held(tree)
        assert taken(watch) == {}  # nothing since
        sh(tree, "echo z > moved/x.txt && rm -rf new && mkdir new && echo m > new/m.txt")
        assert taken(watch) == {
            "moved/x.txt": "all",
            "new": "all",  # removed, made again: all of it looked at
            "new/a": "gone",
            "new/a/b": "gone",
            "new/a/b/n.txt": "gone",
        }
        assert watch.held() == quota.held(tree)
    finally:
        watch.close()


def test_hard_links_count_once(tree: Path) -> None:
    watch = TreeWatch(tree)
    watch.arm()
    try:
        sh(tree, "ln top.txt again.txt && mkdir l && ln src/f3.txt l/f3 && "
                 "head -c 50000 /dev/zero >> again.txt")  # fmt: skip
        assert watch.held() == quota.held(tree)
        sh(tree, "rm top.txt again.txt")
        assert watch.held() == quota.held(tree)
    finally:
        watch.close()


def test_many_new_directories_are_all_listed(tree: Path) -> None:
    """Files made in new directories before their watches exist are found by the listing."""
    with armed(tree) as watch:
        sh(tree, "for d in $(seq 1 30); do mkdir -p n/$d/e && touch n/$d/e/f n/$d/g; done")
        dirty = watch.take()
        assert dirty == [("n", "all")]
        assert watch.held() == quota.held(tree)
        sh(tree, "touch n/7/e/late")  # a watch on each new directory
        assert taken(watch) == {"n/7/e/late": "all"}


def test_an_overflow_makes_the_next_take_a_walk(tree: Path) -> None:
    """``IN_Q_OVERFLOW`` cannot be caused unprivileged with a small queue: injected (the
    event's handling is the same), then the watch is armed again and sees changes again."""
    with armed(tree) as watch:
        sh(tree, "echo a > a.txt")
        watch._event(-1, 0x4000, "", set())  # IN_Q_OVERFLOW, as the kernel queues it
        sh(tree, "echo b > b.txt")
        assert watch.take() is None  # walk it all
        assert watch.held() == quota.held(tree)
        sh(tree, "echo c > c.txt")
        assert taken(watch) == {"c.txt": "all"}


def test_a_watch_past_the_cap_makes_it_walk(tree: Path) -> None:
    with armed(tree, max_watches=4) as watch:  # the root, src, src/deep: one more directory
        sh(tree, "mkdir one && mkdir two && touch two/t")
        assert watch.take() is None
        assert watch.held() is None  # over the cap: the caller walks
        assert watch.take() is None
        sh(tree, "rm -rf two")
        watch.take()  # armed at the cap's side again: three directories watched
        sh(tree, "touch one/x")
        assert taken(watch) == {"one/x": "all"}
        assert os.path.exists(tree / "one" / "x")


def test_the_tree_removed_is_unknown(tree: Path) -> None:
    with armed(tree) as watch:
        sh(tree.parent, "mv tree gone && mkdir tree && echo new > tree/n")
        assert watch.take() is None
        assert watch.held() == quota.held(tree)
