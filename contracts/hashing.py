"""The hash chain and the tree hash, so anyone can verify a log and a rebuilt tree.

* Event hash: ``sha256(payload)`` as lowercase hex, where ``payload`` is the exact bytes of
  the event message. The first event of a workspace has ``prev_hash = ZERO_HASH``.
* Tree hash: the sum, modulo 2**256, of one digest per entry of the tree, as 64 hex digits
  (``ZERO_HASH`` for an empty tree). An entry's digest is ``sha256`` of
  ``"f\\0<path>\\0<content sha256>\\0<0|1 executable>"`` for a file and ``"d\\0<path>"`` for a
  directory, read as a big-endian integer. Being a sum, it is updated in O(changes).
"""

from __future__ import annotations

import hashlib

ZERO_HASH = "0" * 64
_MOD = 1 << 256


def event_hash(payload: bytes) -> str:
    return hashlib.sha256(payload).hexdigest()


def content_sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_digest(path: str, sha256: str, executable: bool) -> int:
    raw = f"f\0{path}\0{sha256}\0{int(executable)}".encode()
    return int.from_bytes(hashlib.sha256(raw).digest(), "big")


def dir_digest(path: str) -> int:
    return int.from_bytes(hashlib.sha256(f"d\0{path}".encode()).digest(), "big")


def tree_add(tree: int, digest: int) -> int:
    return (tree + digest) % _MOD


def tree_remove(tree: int, digest: int) -> int:
    return (tree - digest) % _MOD


def tree_hex(tree: int) -> str:
    return f"{tree:064x}"


def tree_int(hexdigest: str) -> int:
    return int(hexdigest, 16)
