"""A data directory only its owner reads.

Every tenant's files are in a stack's data directory: the projections (``writer.db``,
``reader.db`` and their ``-wal``/``-shm``: every file of every workspace), the logs, the
snapshots being made, ``stack.json``, the NATS server's configuration (passwords) and its
JetStream store. They were 0644 in 0755 directories: any local user read every tenant's
files (issue 28, item 6). Now:

* ``umask``: a process makes what it creates owner-only (umask ``0o077``): ``quill up``,
  ``quill cluster up`` (and so NATS) and the writer, reader and gateway processes, at start.
  The executor keeps ``0o022``: the sandbox's user, another uid, reads the trees it writes for
  commands (``checkouts/``, ``scratch/``); the executor's own directory is 0700, which keeps
  everyone else out of them (a bind mount does not look at the directories above its source,
  so the sandbox is not).
* ``tighten``: at start, what an earlier version left readable is made owner-only (group and
  other bits removed, nothing else changed), and the caller says how many paths it changed.
  Symbolic links are neither followed nor changed; the sandbox's trees (a directory named in
  ``SANDBOX_TREES``) are made owner-only themselves but never entered: their modes are what
  the sandbox's user needs.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

log = logging.getLogger("quill.private")

PRIVATE_UMASK = 0o077
SANDBOX_UMASK = 0o022
"""The executor's: the sandbox's user must read what it writes for commands."""
SANDBOX_TREES = frozenset({"checkouts", "scratch"})
"""An executor's directories whose contents the sandbox's user reads and writes."""
_OTHERS = 0o077


def umask(service: str) -> None:
    """Set this process's umask for ``service`` (``executor``: ``SANDBOX_UMASK``; any other:
    ``PRIVATE_UMASK``). Only for a process's entry point: the umask is the whole process's."""
    os.umask(SANDBOX_UMASK if service == "executor" else PRIVATE_UMASK)


def tighten(root: Path) -> list[Path]:
    """Make ``root`` and what is under it owner-only (made 0700 if missing); the paths whose
    mode changed. The sandbox's trees are tightened but not entered; links are left alone.

    Raises:
        OSError: ``root`` cannot be made or changed (a path under it that vanishes or cannot
            be changed is skipped, logged).
    """
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    changed: list[Path] = []
    todo = [root]
    while todo:  # iterative: no depth limit
        path = todo.pop()
        try:
            st = path.lstat()
            if stat.S_ISLNK(st.st_mode):
                continue
            if st.st_mode & _OTHERS:
                os.chmod(path, stat.S_IMODE(st.st_mode) & ~_OTHERS, follow_symlinks=False)
                changed.append(path)
            if stat.S_ISDIR(st.st_mode) and (path == root or path.name not in SANDBOX_TREES):
                with os.scandir(path) as entries:
                    todo.extend(Path(entry.path) for entry in entries)
        except FileNotFoundError:
            continue
        except OSError as exc:
            if path == root:
                raise
            log.warning("could not make %s owner-only: %s", path, exc)
    return changed


def tighten_logged(root: Path, who: str) -> int:
    """``tighten``, and one log line when it changed anything (how many, where)."""
    changed = tighten(root)
    if changed:
        log.warning(
            "%s: made %d paths under %s owner-only (they were readable by other local users)",
            who,
            len(changed),
            root,
        )
    return len(changed)
