"""A workspace's hash chain, checked event by event: the one check ``quill verify`` makes as it
folds a log (``quill_cli/tools/replay/fold.py``, ``Fold``) and the console makes of the events it
shows (``services/gateway/console/history.py``).

* ``payload``: an event's message hashes (sha256) to the hash recorded with it;
* ``link``: an event follows the one before it: the next version, and its ``prev_hash`` is
  that event's hash (the first event, version 1, follows ``GENESIS``: version 0 and the zero
  hash);
* ``content``: a file content an event carries inline hashes to the ``sha256`` it names.

Each answers ``None`` when it holds, else a ``Broken`` (the version, the message, details):
the caller decides what a break is (``quill verify`` raises it, the console shows it). Pure:
hashes and comparisons, no I/O.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from contracts.hashing import ZERO_HASH

GENESIS = (0, ZERO_HASH)
"""What the first event follows: no version, the zero hash."""


@dataclass(frozen=True)
class Broken:
    """The first check that does not hold."""

    version: int
    message: str
    details: dict[str, str] = field(default_factory=dict)


def payload(data: bytes, carried: str | None, version: int) -> tuple[str, Broken | None]:
    """The hash of the event message ``data`` (of ``version``), and whether it is the hash
    ``carried`` with it (None: nothing carried, nothing to compare)."""
    digest = hashlib.sha256(data).hexdigest()
    if carried is not None and carried != digest:
        return digest, Broken(version, "An event does not hash to the hash recorded with it")
    return digest, None


def link(previous_version: int, previous_hash: str, version: int, prev_hash: str) -> Broken | None:
    """Whether the event (``version``, ``prev_hash``) follows the event (``previous_version``,
    ``previous_hash``): ``GENESIS`` for the first."""
    if version != previous_version + 1:
        return Broken(version, f"Version {version} follows version {previous_version}")
    if prev_hash != previous_hash:
        return Broken(
            version,
            "Hash chain broken: prev_hash is not the previous event's hash",
            {"prev_hash": prev_hash, "previous": previous_hash},
        )
    return None


def content(path: str, data: bytes, sha256: str, version: int) -> Broken | None:
    """Whether the content ``data`` of ``path`` an event of ``version`` carries is ``sha256``."""
    if hashlib.sha256(data).hexdigest() != sha256:
        return Broken(version, f"The content of {path} does not match its sha256")
    return None
