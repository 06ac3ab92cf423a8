"""Workspace URIs (seed 003): ``<host>:<path>``, one address for every kind of workspace.

* ``server:/<tenant>/<workspace>`` (or ``quill:``): a workspace held by Quill;
* ``git:<url>`` (``git:github.com/org/repo`` or ``git:https://...``): a Quill workspace cloned
  from the repository, restricted by default;
* ``<client>:<path>`` (``macbook:~/dev/app``): a folder on a client's machine, served by a
  bridge (``quill attach``) under the name its claim gives.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote

from contracts.errors import ErrorCode, QuillError
from contracts.subjects import check_id

SERVER_HOSTS = frozenset({"server", "quill"})
MAX_URI = 4096
_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}\Z")


@dataclass(frozen=True, slots=True)
class Uri:
    """A parsed workspace URI."""

    kind: str
    """``server``, ``git`` or ``local``."""
    host: str
    path: str
    """For ``server``: ``tenant/workspace``; for ``git``: the repository URL; for ``local``:
    the folder as its client names it."""

    def __str__(self) -> str:
        if self.kind == "server":
            return f"{self.host}:/{self.path}"
        return f"{self.host}:{self.path}"

    @property
    def git_url(self) -> str:
        """``https://...`` for ``git:host/org/repo`` (an explicit scheme is kept)."""
        return self.path if "://" in self.path else f"https://{self.path}"


def parse(uri: str) -> Uri:
    """Parse a workspace URI.

    Raises:
        QuillError: ``INVALID_ARGUMENT`` naming what is wrong.
    """
    if len(uri) > MAX_URI or any(ord(c) < 0x20 for c in uri):
        raise QuillError(ErrorCode.INVALID_ARGUMENT, "Invalid workspace URI")
    host, sep, path = uri.partition(":")
    if not sep or not path or not _HOST.match(host):
        raise QuillError(
            ErrorCode.INVALID_ARGUMENT,
            f"Invalid workspace URI {uri!r}: use server:/<tenant>/<workspace>, git:<url> or "
            "<client>:<path>",
            {"uri": uri},
        )
    if host in SERVER_HOSTS:
        parts = path.strip("/").split("/")
        if len(parts) != 2:
            raise QuillError(
                ErrorCode.INVALID_ARGUMENT,
                f"Invalid server URI {uri!r}: use {host}:/<tenant>/<workspace>",
                {"uri": uri},
            )
        tenant, workspace = check_id("tenant", parts[0]), check_id("workspace", parts[1])
        return Uri("server", host, f"{tenant}/{workspace}")
    if host == "git":
        return Uri("git", host, _check_git_url(uri, path))
    return Uri("local", host, path)


def check_target(target: str) -> tuple[str, str]:
    """``(tenant, workspace)`` of an attach target: exactly ``<tenant>/<workspace>``, two
    valid ids (so no ``..``, ``.``, empty or percent-encoded segment names another one).

    Raises:
        QuillError: ``INVALID_ARGUMENT`` otherwise.
    """
    parts = target.split("/")
    if len(parts) != 2:
        raise QuillError(
            ErrorCode.INVALID_ARGUMENT,
            "Invalid attach target: use <tenant>/<workspace>",
            {"target": target},
        )
    return check_id("tenant", parts[0]), check_id("workspace", parts[1])


def _check_git_url(uri: str, path: str) -> str:
    """``path`` of a ``git:`` URI, refused when a segment is empty (but a trailing ``/``),
    ``.`` or ``..``, or hides a ``/`` or a dot segment behind percent-encoding."""
    rest = path.split("://", 1)[1] if "://" in path else path
    segments = rest.split("/")
    if len(segments) > 1 and segments[-1] == "":
        segments.pop()  # git:host/org/repo/
    for segment in segments:
        decoded = unquote(segment)
        if decoded in ("", ".", "..") or "/" in decoded or "\\" in decoded:
            raise QuillError(
                ErrorCode.INVALID_ARGUMENT,
                "Invalid git URI: a segment of its URL is empty, '.' or '..'",
                {"uri": uri},
            )
    return path
