"""Who a process is to NATS: nobody (an open server), a user and password, or an nkey.

Every Quill process (services, SDK, CLI) reads the same environment variables, so that
credentials never appear on a command line (``ps`` shows argv to every user)::

    QUILL_NATS_USER       user name (with QUILL_NATS_PASSWORD)
    QUILL_NATS_PASSWORD   its password
    QUILL_NATS_NKEY       a file holding an nkey seed (``SU...``), instead of a user
    QUILL_NATS_INBOX      the inbox prefix for replies (default below)

A tenant may only subscribe to its own inboxes (``_INBOX_<tenant>.>``, see
``quill_cli/tenants.py``), so a connection with a user name uses ``_INBOX_<user>`` unless told
otherwise; a tenant's user is named after the tenant. Without a user, ``_INBOX``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

DEFAULT_INBOX = "_INBOX"
SYSTEM_USER = "quill-system"
"""The services' NATS user under ``--tenants``; no tenant may have this name."""
_TOKEN = re.compile(r"[A-Za-z0-9_-]+\Z")


@dataclass(frozen=True)
class NatsAuth:
    """Credentials for ``nats.connect``; all ``None``: connect without any."""

    user: str | None = None
    password: str | None = None
    nkey_seed: str | None = None
    """Path of a file holding an nkey seed."""
    inbox_prefix: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> NatsAuth:
        env = os.environ if env is None else env
        return cls(
            user=env.get("QUILL_NATS_USER") or None,
            password=env.get("QUILL_NATS_PASSWORD") or None,
            nkey_seed=env.get("QUILL_NATS_NKEY") or None,
            inbox_prefix=env.get("QUILL_NATS_INBOX") or None,
        )

    @property
    def inbox(self) -> str:
        """The inbox prefix: given, else ``_INBOX_<user>``, else ``_INBOX``."""
        if self.inbox_prefix:
            return self.inbox_prefix
        if self.user and _TOKEN.match(self.user):
            return f"{DEFAULT_INBOX}_{self.user}"
        return DEFAULT_INBOX

    def options(self) -> dict[str, Any]:
        """Keyword arguments for ``nats.connect``.

        Raises:
            ValueError: a user without a password (or the reverse), or both a user and an nkey.
        """
        if (self.user is None) != (self.password is None):
            raise ValueError("a NATS user needs a password (QUILL_NATS_USER, QUILL_NATS_PASSWORD)")
        if self.user is not None and self.nkey_seed is not None:
            raise ValueError("give a NATS user and password, or an nkey seed file, not both")
        options: dict[str, Any] = {"inbox_prefix": self.inbox}
        if self.user is not None:
            options.update(user=self.user, password=self.password)
        if self.nkey_seed is not None:
            options["nkeys_seed"] = self.nkey_seed
        return options

    def environ(self) -> dict[str, str]:
        """These credentials as the environment variables above (for a child process)."""
        names = {
            "QUILL_NATS_USER": self.user,
            "QUILL_NATS_PASSWORD": self.password,
            "QUILL_NATS_NKEY": self.nkey_seed,
            "QUILL_NATS_INBOX": self.inbox_prefix,
        }
        return {name: value for name, value in names.items() if value is not None}


ENV_NAMES = ("QUILL_NATS_USER", "QUILL_NATS_PASSWORD", "QUILL_NATS_NKEY", "QUILL_NATS_INBOX")
