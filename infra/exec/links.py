"""A fork's first checkout made of hard links to its source's checkout on the same executor.

A fork's tree at its fork point ``N`` *is* its source's at ``N`` (issue 33). When the
executor already holds the source's checkout with that tree (its tracked paths sum to the
``workspace_forked`` event's ``tree_hash``; at another version: below), the fork's ``tree/``
is made of hard links to the source's files (one ``linkat`` and one ``lstat`` a file, no
content read or written), then the fork's own events since ``N`` are applied as any sync
applies them: O(files changed since the fork point) of contents, not a reader's whole tree,
nor the log (``Builds._from_source``).

A source's checkout at another version ``M`` than the fork point (the source moved on after
the fork, the common case: an agent keeps working on it; or its checkout is behind) holds the
tree at ``M``, not at ``N``. Its reader names the paths changed between the two (``qry.tree``
with ``changed_from``: the events' summaries and the rows ended in between, through a fork's
layers, ``services.reader.changes``) and gives their entries as of ``N`` with what is below
them: everything the source's manifest tracks neither at nor below one of them is linked
(``outside``), those entries are written from the reader's answer, and the manifest built
must sum to the event's tree hash (else: built from a reader's tree). Every path made or
removed in between is named (the writer commits each parent it makes; a directory removed is
named alone), so a path that changed kind, mode or content is never linked. Past
``TREE_CHANGED_MOST`` paths (or a range compaction trimmed) the reader says it cannot tell,
and the checkout is a reader's tree.

Why hard links are safe, and only where they are used. Two names of one inode are one file:
whatever writes it *in place* (``>``, ``>>``, ``truncate``, ``chmod``, an editor writing
through) changes both checkouts. So:

* The executor never writes a checkout's file in place: ``infra.safefs`` writes a new file and
  renames it over the name, and a mode change of a file with other links rewrites it
  (``Dir.set_mode``).
* Commands run over an overlay of ``tree/`` (``Provider.overlays``: bwrap as root): ``tree/``
  is the overlay's lower layer, which the command cannot change; a file it opens for writing
  or chmods is copied up whole into its layer, and the merge renames it over the name in
  ``tree/`` (``infra.exec.layers``). So links are made only then (the executor's
  ``Checkouts`` gives a live checkout a source only when its provider runs commands over
  overlays), never for a shell's checkout (its commands write it in place) nor for one
  built at an older version.
* Both checkouts are marked (``LINKED`` in their homes): an executor started later without
  overlays (the local provider, ``overlay = false``, a kernel that cannot mount one) wipes a
  marked checkout when it opens it, before any command could write through a shared inode
  (``Checkout.open``).

What is linked is checked: a tracked path of the source's manifest not left uncommitted there
(``local``/``present``), linked without following a link, and the new name must be a regular
file with the inode, size, mtime and executable bit the source's manifest recorded for it (its ctime
moves with every link made or removed, so it is not compared: in overlay mode nothing else
can change a file of ``tree/`` without replacing its inode). Anything else (a mismatch, a
path the source holds uncommitted) is fetched from a reader at ``N`` instead, a few at most;
more, or another filesystem (``EXDEV``), and the checkout is built from a reader's tree as
before.

A linked file's ctime changes when another checkout links or unlinks it, so the stat
signatures other checkouts recorded for it go stale: a capture walking the whole tree then
re-reads it (correct, only slower; over overlays, a capture looks at the paths a command
touched only). The disk budget counts a shared file in each checkout that holds it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Mapping
from typing import NamedTuple

from contracts import hashing
from contracts.paths import ancestors
from infra.exec.capture import file_sig
from infra.exec.manifest import Tracked
from infra.safefs import Dir, open_path, parent_of

LINKED = "linked"
"""In a checkout's home: some of its files are hard links shared with another checkout."""
MAX_MISSING = 64
"""Files of the source's checkout that may fail the check and be fetched from a reader; more
and the fork's checkout is built from a reader's tree."""


class Linked(NamedTuple):
    paths: dict[str, Tracked]
    """What the fork's ``tree/`` now holds, by path (directories and linked files)."""
    missing: dict[str, Tracked]
    """Files not linked (their contents are to be fetched), as the source tracked them."""


class TooMany(Exception):
    """More files failed the check than ``MAX_MISSING``."""


def tree_hash(paths: Mapping[str, Tracked]) -> str:
    """The tree hash of what ``paths`` track (``contracts.hashing``), as a log event names it."""
    total = 0
    for path, tracked in paths.items():
        if not path:
            continue
        if tracked.sha256 is None:
            digest = hashing.dir_digest(path)
        else:
            digest = hashing.file_digest(path, tracked.sha256, tracked.executable)
        total = hashing.tree_add(total, digest)
    return hashing.tree_hex(total)


def outside(paths: Mapping[str, Tracked], changed: set[str]) -> dict[str, Tracked]:
    """What ``paths`` track neither at nor below a path of ``changed`` (what the source's
    checkout holds that its fork's first checkout may link: unchanged since the fork point).
    A pass over the paths, no file touched."""
    if not changed:
        return dict(paths)
    return {
        path: tracked
        for path, tracked in paths.items()
        if path not in changed and not any(a in changed for a in ancestors(path))
    }


def _same(st: os.stat_result, tracked: Tracked) -> bool:
    """The linked name is the file the source's manifest recorded (not its ctime)."""
    sig = tracked.sig
    return (
        sig is not None
        and stat.S_ISREG(st.st_mode)
        and bool(st.st_mode & 0o100) == tracked.executable  # as capture reads the mode
        and (st.st_size, st.st_mtime_ns, st.st_ino) == (sig[0], sig[1], sig[3])
    )


def link_tree(source: Dir, tree: Dir, paths: Mapping[str, Tracked], skip: set[str]) -> Linked:
    """Make ``tree`` (empty) hold what ``paths`` (the source's manifest) track: directories
    made, files hard-linked from ``source`` and checked; ``skip``: paths the source holds
    uncommitted (not linked). Blocking.

    Raises:
        TooMany: more than ``MAX_MISSING`` files could not be linked.
        OSError: ``EXDEV`` (another filesystem), or a directory could not be made.
    """
    out: dict[str, Tracked] = {}
    missing: dict[str, Tracked] = {}
    files: dict[str, list[tuple[str, str, Tracked]]] = {}
    for path in sorted(p for p in paths if p):  # parents before children
        tracked = paths[path]
        if tracked.sha256 is None:
            with parent_of(tree, path, create=True) as found:
                assert found is not None
                found[0].ensure_dir(found[1]).close()
            out[path] = Tracked(None)
        elif path in skip:
            missing[path] = tracked
        else:
            parent, _, name = path.rpartition("/")
            files.setdefault(parent, []).append((path, name, tracked))
    for parent, names in files.items():
        with contextlib.ExitStack() as stack:
            src = open_path(source, parent)
            dst = open_path(tree, parent)
            for d in (src, dst):
                if d is not None:
                    stack.callback(d.close)
            for path, name, tracked in names:
                st = None
                if src is not None and dst is not None:
                    try:
                        st = src.link(name, dst, name)
                    except OSError as exc:
                        if exc.errno == errno.EXDEV:
                            raise
                    if st is not None and not _same(st, tracked):
                        dst.remove(name)
                        st = None
                if st is None:
                    missing[path] = tracked
                    if len(missing) > MAX_MISSING:
                        raise TooMany(f"more than {MAX_MISSING} files of the source differ")
                    continue
                out[path] = Tracked(tracked.sha256, tracked.executable, file_sig(st))
    return Linked(out, missing)
