"""Secret redaction (RFC 0059 WSR-1): registered secret values never reach the log.

A registry maps secret ids to values (and, optionally, to regular expressions for secrets
known by shape). The writer redacts every file content it commits, the executor every command
output it returns: each occurrence becomes ``[REDACTED:<id>]``, the longest value first.
Values shorter than ``MIN_LENGTH`` are not registered (they would redact ordinary text).
Audit records name the ids redacted, never the values.

The registry is a TOML file (``--secrets FILE``)::

    [secrets]
    openai = "sk-live-0123456789abcdef"
    github = { env = "GITHUB_TOKEN" }          # the value of an environment variable

    [[patterns]]
    id = "aws-key"
    regex = "AKIA[0-9A-Z]{16}"
"""

from __future__ import annotations

import logging
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import regex

log = logging.getLogger("quill.secrets")

MIN_LENGTH = 8


def marker(secret_id: str) -> str:
    return f"[REDACTED:{secret_id}]"


class Secrets:
    """The registry; ``redact`` and ``redact_bytes`` apply it."""

    def __init__(
        self, values: Mapping[str, str] | None = None, patterns: Mapping[str, str] | None = None
    ) -> None:
        """``values``: id → value; ``patterns``: id → regular expression."""
        self._ids: list[str] = []
        alternatives: list[str] = []
        for secret_id, value in sorted((values or {}).items(), key=lambda kv: -len(kv[1])):
            if len(value) < MIN_LENGTH:
                log.warning(
                    "secret %s is shorter than %d characters: not registered", secret_id, MIN_LENGTH
                )
                continue
            self._ids.append(secret_id)
            alternatives.append(regex.escape(value))
        for secret_id, pattern in (patterns or {}).items():
            self._ids.append(secret_id)
            alternatives.append(pattern)
        groups = "|".join(f"(?P<s{i}>{a})" for i, a in enumerate(alternatives))
        self._text = regex.compile(groups) if self._ids else None
        self._bytes = regex.compile(groups.encode("utf-8", "surrogatepass")) if self._ids else None

    def __bool__(self) -> bool:
        return bool(self._ids)

    def __len__(self) -> int:
        return len(self._ids)

    def _id(self, match: Any) -> str:
        return self._ids[int(match.lastgroup[1:])]

    def redact(self, text: str) -> tuple[str, list[str]]:
        """``text`` with every registered secret replaced, and the ids replaced (sorted)."""
        if self._text is None:
            return text, []
        found: set[str] = set()

        def replace(match: Any) -> str:
            found.add(secret_id := self._id(match))
            return marker(secret_id)

        return self._text.sub(replace, text), sorted(found)

    def redact_bytes(self, data: bytes) -> tuple[bytes, list[str]]:
        """The same for bytes (binary files, raw output)."""
        if self._bytes is None:
            return data, []
        found: set[str] = set()

        def replace(match: Any) -> bytes:
            found.add(secret_id := self._id(match))
            return marker(secret_id).encode()

        return self._bytes.sub(replace, data), sorted(found)

    @classmethod
    def load(cls, path: Path) -> Secrets:
        """Read the registry file.

        Raises:
            ValueError: it is malformed (an unknown key, a missing variable, a bad regex).
        """
        with path.open("rb") as f:
            data = tomllib.load(f)
        unknown = set(data) - {"secrets", "patterns"}
        if unknown:
            raise ValueError(f"{path}: unknown tables {sorted(unknown)}")
        values: dict[str, str] = {}
        for secret_id, value in data.get("secrets", {}).items():
            if isinstance(value, dict) and set(value) == {"env"}:
                resolved = os.environ.get(str(value["env"]))
                if resolved is None:
                    raise ValueError(f"{path}: secret {secret_id}: ${value['env']} is not set")
                values[secret_id] = resolved
            elif isinstance(value, str):
                values[secret_id] = value
            else:
                raise ValueError(f"{path}: secret {secret_id}: a string or {{ env = ... }}")
        patterns: dict[str, str] = {}
        for item in data.get("patterns", []):
            if set(item) != {"id", "regex"}:
                raise ValueError(f"{path}: each [[patterns]] has id and regex")
            try:
                regex.compile(item["regex"])
            except regex.error as exc:
                raise ValueError(f"{path}: pattern {item['id']}: {exc}") from None
            patterns[str(item["id"])] = str(item["regex"])
        return cls(values, patterns)


NO_SECRETS = Secrets()

ENV_FILE = "QUILL_SECRETS"
"""The environment variable naming the registry file (``quill up --secrets`` sets it)."""


def secrets_from_env() -> Secrets:
    """The registry named by ``$QUILL_SECRETS`` (none: nothing is redacted).

    Raises:
        ValueError: the file is malformed.
    """
    path = os.environ.get(ENV_FILE)
    if not path:
        return NO_SECRETS
    secrets = Secrets.load(Path(path))
    log.info("redacting %d secrets from %s", len(secrets), path)
    return secrets
