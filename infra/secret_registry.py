"""The secret registry as a process reads it: the TOML file (``load``), the one
``$QUILL_SECRETS`` names (``secrets_from_env``, read once per process), and the log filter
that redacts it from every service's log records. Matching and redacting are pure
(``core/secrets.py``)."""

from __future__ import annotations

import logging
import os
import threading
import tomllib
from pathlib import Path

import regex

from core.secrets import MIN_LENGTH, NO_SECRETS, Secrets
from infra.logfields import FIELDS

log = logging.getLogger("quill.secrets")


def load(path: Path) -> Secrets:
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
    return Secrets(values, patterns)


ENV_FILE = "QUILL_SECRETS"
"""The environment variable naming the registry file (``quill up --secrets`` sets it)."""

_ENV_KEY = os.fsencode(ENV_FILE)
_ENVIRON: dict[bytes, bytes] | None = getattr(os.environ, "_data", None)
_loaded: dict[str, Secrets] = {}
_loading = threading.local()


def secrets_from_env() -> Secrets:
    """The registry named by ``$QUILL_SECRETS`` (none: nothing is redacted), read once per
    process and file name.

    Raises:
        ValueError: the file is malformed.
    """
    # os.environ's own store, read without its str round trips: every request asks (~0.5 µs
    # a call through os.environ.get, several calls a read); the same value, kept current.
    raw = _ENVIRON.get(_ENV_KEY) if _ENVIRON is not None else os.environb.get(_ENV_KEY)
    if not raw:
        return NO_SECRETS
    path = os.fsdecode(raw)
    secrets = _loaded.get(path)
    if secrets is None:
        _loading.active = True
        try:
            secrets = _loaded[path] = load(Path(path))
        finally:
            _loading.active = False
        for secret_id in secrets.too_short:
            log.warning(
                "secret %s is shorter than %d characters: not registered", secret_id, MIN_LENGTH
            )
        log.info("redacting %d secrets from %s", len(secrets), path)
    return secrets


# ---------------------------------------------------------------- names (refused)


class LogFilter(logging.Filter):
    """Redacts every registered secret (``$QUILL_SECRETS``) from a log record's message,
    traceback and request fields; installed on the handler of every service process
    (``runtime.setup_logging``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(_loading, "active", False):
            return True
        try:
            secrets = secrets_from_env()
        except (OSError, ValueError, tomllib.TOMLDecodeError):
            return True  # the service refuses to start with it, and says so
        if not secrets:
            return True
        try:
            message, ids = secrets.redact(record.getMessage())
        except Exception:  # a malformed record: the handler reports it, without its args
            record.msg, record.args = secrets.redact(str(record.msg))[0], None
            return True
        if ids:
            record.msg, record.args = message, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = secrets.redact(record.exc_text)[0]
        if record.stack_info:
            record.stack_info = secrets.redact(record.stack_info)[0]
        for name in FIELDS:  # infra.logfields: what the request named
            value = getattr(record, name, None)
            if isinstance(value, str) and value:
                setattr(record, name, secrets.redact(value)[0])
        return True
