"""The executor's git configuration: a token per remote host, and the remotes it may reach.

Credentials are configured per host (``Credentials.load`` reads ``[[git.credential]]`` from
TOML; or build ``Credentials((Credential(host=..., token_file=...),))``); the token is read at
each use, so short-lived tokens may be rotated in place. How a token reaches git, and only the
host it is for, is ``remote``'s part. The same file's ``[git] allow = ["HOST[:PORT]", ...]``
is the allow-list of remotes that are not public (``targets``); ``Credentials.allowing`` adds
entries (``quill executor --git-allow``).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contracts.errors import ErrorCode, QuillError
from infra.exec.git.targets import Targets


@dataclass(frozen=True, slots=True)
class Credential:
    """A token for one remote host, read from a file or an environment variable at each use."""

    host: str
    """As git names it: ``github.com``, or ``host:port`` for a non-default port."""
    username: str = "x-access-token"
    token_file: Path | None = None
    token_env: str | None = None
    protocol: str = "https"
    """``http`` only for a trusted network (the token would cross it in clear)."""

    def __post_init__(self) -> None:
        if (self.token_file is None) == (self.token_env is None):
            raise ValueError(f"credential for {self.host}: give token_file or token_env")
        if self.protocol not in ("https", "http"):
            raise ValueError(f"credential for {self.host}: protocol must be https or http")
        if not self.host or self.host != self.host.lower() or "/" in self.host:
            raise ValueError(f"credential host must be a lower-case host[:port]: {self.host!r}")
        if not self.username or has_control_chars(self.username):
            raise ValueError(f"credential for {self.host}: bad username")

    def token(self) -> str:
        """The current token.

        Raises:
            QuillError: ``EXECUTION_FAILED`` when it cannot be read (the token is not named).
        """
        try:
            if self.token_file is not None:
                value = self.token_file.read_text().strip()
            else:
                value = os.environ.get(self.token_env or "", "").strip()
        except OSError as e:
            raise QuillError(
                ErrorCode.EXECUTION_FAILED,
                f"The credential for {self.host} cannot be read ({e.strerror})",
            ) from None
        if not value or has_control_chars(value):
            raise QuillError(
                ErrorCode.EXECUTION_FAILED, f"The credential for {self.host} is empty or invalid"
            )
        return value


@dataclass(frozen=True, slots=True)
class Credentials:
    """The executor's git credentials, at most one per (protocol, host), and where remote git
    may connect (``targets``: public addresses, and the allow-list)."""

    entries: tuple[Credential, ...] = ()
    targets: Targets = Targets()

    @classmethod
    def load(cls, path: Path) -> Credentials:
        """Read ``[[git.credential]]`` tables (host, username, token_file | token_env,
        protocol) and ``[git] allow`` (a list of ``HOST[:PORT]``) from a TOML file.

        Raises:
            ValueError: the file is malformed.
        """
        with path.open("rb") as f:
            return cls.from_mapping(tomllib.load(f))

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> Credentials:
        """``{"git": {"credential": [{...}, ...], "allow": [...]}}``, as in the TOML file.

        Raises:
            ValueError: a table is malformed, or two name the same protocol and host; an
                allow-list entry is malformed.
        """
        entries: list[Credential] = []
        allow = data.get("git", {}).get("allow", [])
        if not isinstance(allow, list) or not all(isinstance(a, str) for a in allow):
            raise ValueError('git.allow: a list of "HOST[:PORT]" strings')
        for item in data.get("git", {}).get("credential", []):
            if not isinstance(item, Mapping) or "host" not in item:
                raise ValueError("git.credential: each entry needs a host")
            unknown = set(item) - {"host", "username", "token_file", "token_env", "protocol"}
            if unknown:
                raise ValueError(f"git.credential: unknown keys {sorted(unknown)}")
            token_file = item.get("token_file")
            cred = Credential(
                host=str(item["host"]).lower(),
                username=str(item.get("username", "x-access-token")),
                token_file=Path(token_file) if token_file is not None else None,
                token_env=item.get("token_env"),
                protocol=str(item.get("protocol", "https")),
            )
            if any((c.protocol, c.host) == (cred.protocol, cred.host) for c in entries):
                raise ValueError(f"git.credential: {cred.protocol}://{cred.host} twice")
            entries.append(cred)
        return cls(tuple(entries), Targets().allowing(allow))

    def allowing(self, entries: Sequence[str]) -> Credentials:
        """These credentials with more allow-list entries (``HOST[:PORT]``).

        Raises:
            ValueError: an entry is malformed.
        """
        return Credentials(self.entries, self.targets.allowing(entries))

    def find(self, protocol: str, host: str) -> Credential | None:
        return next((c for c in self.entries if (c.protocol, c.host) == (protocol, host)), None)


def has_control_chars(text: str) -> bool:
    """Whether ``text`` has an ASCII control character."""
    return any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in text)
