"""Builders for the merge tests: three small trees as dicts, the ``Sides`` of the paths
changed between them (as the writer would hand them), and a plan applied to ours."""

from __future__ import annotations

from dataclasses import dataclass, field

from contracts import hashing
from contracts.events import MakeDir, Remove
from contracts.paths import ancestors, is_within
from core.content import is_binary
from core.diff3 import Labels
from core.merge import plan
from core.merge_types import Dir, Entry, File, MergePlan, Put, Sides, Strategy, same

DIR = "<dir>"
LABELS = Labels("main@12", "main@7", "fork@15")

Node = bytes | str | tuple[str, bytes]
"""A file's bytes, ``DIR``, or ``("x", bytes)``: an executable file."""
Tree = dict[str, Node]


def full(tree: Tree) -> Tree:
    """``tree`` with the directories its paths need."""
    out = dict(tree)
    for path in tree:
        for a in ancestors(path):
            out.setdefault(a, DIR)
    return out


def entry(node: Node | None) -> Entry:
    if node is None:
        return None
    if node == DIR:
        return Dir()
    executable, data = (True, node[1]) if isinstance(node, tuple) else (False, node)
    assert isinstance(data, bytes)
    return File(
        sha256=hashing.content_sha256(data),
        size=len(data),
        executable=executable,
        binary=is_binary(data),
    )


def data_of(node: Node) -> bytes:
    data = node[1] if isinstance(node, tuple) else node
    assert isinstance(data, bytes)
    return data


@dataclass
class Case:
    base: Tree
    ours: Tree
    theirs: Tree
    read: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.base, self.ours, self.theirs = full(self.base), full(self.ours), full(self.theirs)
        self.store = {
            hashing.content_sha256(data_of(n)): data_of(n)
            for t in (self.base, self.ours, self.theirs)
            for n in t.values()
            if n != DIR
        }

    def sides(self) -> list[Sides]:
        """The paths changed on either side, as the writer hands them."""
        out = []
        for path in sorted({*self.base, *self.ours, *self.theirs}):
            b, o, t = (entry(tree.get(path)) for tree in (self.base, self.ours, self.theirs))
            if not (same(o, b) and same(t, b)):
                out.append(Sides(path, b, o, t))
        return out

    def content(self, sha256: str) -> bytes | None:
        self.read.append(sha256)
        return self.store.get(sha256)

    def plan(self, strategy: Strategy = "fail", **kw: object) -> MergePlan:
        kw.setdefault("max_file_bytes", 1 << 20)
        return plan(self.sides(), strategy, self.content, labels=LABELS, **kw)  # type: ignore[arg-type]

    def merged(self, strategy: Strategy = "fail", **kw: object) -> Tree:
        """Ours after the plan's changes (each checked to apply: parents exist, a path made
        is free, a path removed is there)."""
        p = self.plan(strategy, **kw)
        assert p.refused is None, p.refused
        return apply(self.ours, p, self.store)


def apply(ours: Tree, p: MergePlan, store: dict[str, bytes]) -> Tree:
    tree = dict(ours)
    for change in p.changes:
        path = change.path
        for a in ancestors(path):
            assert tree.get(a) == DIR, f"{change}: no directory {a}"
        if isinstance(change, Remove):
            assert path in tree, f"{change}: nothing to remove"
            tree = {q: n for q, n in tree.items() if not is_within(q, path)}
        elif isinstance(change, MakeDir):
            assert path not in tree, f"{change}: {path} exists"
            tree[path] = DIR
        else:
            assert isinstance(change, Put)
            assert tree.get(path) != DIR, f"{change}: a directory is there"
            data = change.data if change.data is not None else store[change.sha256]
            assert hashing.content_sha256(data) == change.sha256 and len(data) == change.size
            tree[path] = ("x", data) if change.executable else data
    return tree
