"""Secret redaction (RFC 0059 WSR-1): registered secret values never reach the log.

A registry maps secret ids to values (and, optionally, to regular expressions for secrets
known by shape). The writer redacts every file content it commits, the executor every command
output it returns: each occurrence becomes ``[REDACTED:<id>]``, the longest value first.
Values shorter than ``MIN_LENGTH`` are not registered (they would redact ordinary text).
Audit records name the ids redacted, never the values.

Contents and command lines are redacted; names are not, since a redacted name names something
else (a path, an actor, a session, a branch, a workdir, a URI). ``refuse_names`` is the one
check every service's edge (``infra/entry.py``) makes on everything a request names:
its subject, its ``Ws-*`` headers and every field of its body but the ``CONTENT_FIELDS``; a
name holding a secret is refused with ``INVALID_ARGUMENT`` and a message that does not hold
it. Error messages are redacted before they leave (``redact_error``), live output through a
``StreamRedactor`` (a secret split across two chunks is caught), and every service log line
through ``LogFilter``. The file and the environment are read in
``infra/secret_registry.py``; this module is pure.

The registry is a TOML file (``--secrets FILE``)::

    [secrets]
    openai = "sk-live-0123456789abcdef"
    github = { env = "GITHUB_TOKEN" }          # the value of an environment variable

    [[patterns]]
    id = "aws-key"
    regex = "AKIA[0-9A-Z]{16}"
"""

from __future__ import annotations

import dataclasses
import re._parser as sre_parse
from collections.abc import Callable, Iterator, Mapping
from typing import Any, AnyStr

import msgspec
import regex

from contracts.errors import ErrorCode, QuillError
from contracts.subjects import Address, Origin

MIN_LENGTH = 8
PATTERN_SPAN = 1024
"""The longest match assumed of a pattern whose regex has no bound (``a+``): how much live
output a ``StreamRedactor`` holds back for it."""


def _width(pattern: str) -> int:
    """The longest text ``pattern`` can match (``PATTERN_SPAN`` when unbounded or unknown)."""
    try:
        widest = sre_parse.parse(pattern).getwidth()[1]
    except Exception:  # syntax only the regex module knows
        return PATTERN_SPAN
    return min(int(widest), PATTERN_SPAN)


def marker(secret_id: str) -> str:
    return f"[REDACTED:{secret_id}]"


class Secrets:
    """The registry; ``redact`` and ``redact_bytes`` apply it."""

    def __init__(
        self, values: Mapping[str, str] | None = None, patterns: Mapping[str, str] | None = None
    ) -> None:
        """``values``: id → value; ``patterns``: id → regular expression."""
        self._ids: list[str] = []
        self.too_short: list[str] = []
        """Ids of values not registered (shorter than ``MIN_LENGTH``)."""
        self.span = 1
        """The longest text one secret can be, in bytes (patterns: their regex's bound)."""
        alternatives: list[str] = []
        for secret_id, value in sorted((values or {}).items(), key=lambda kv: -len(kv[1])):
            if len(value) < MIN_LENGTH:
                self.too_short.append(secret_id)
                continue
            self._ids.append(secret_id)
            alternatives.append(regex.escape(value))
            self.span = max(self.span, len(value.encode("utf-8", "surrogatepass")))
        for secret_id, pattern in (patterns or {}).items():
            self._ids.append(secret_id)
            alternatives.append(pattern)
            self.span = max(self.span, 4 * _width(pattern))  # characters: up to 4 bytes each
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
        return self._replaced(self._text, text, marker)

    def redact_bytes(self, data: bytes) -> tuple[bytes, list[str]]:
        """The same for bytes (binary files, raw output)."""
        if self._bytes is None:
            return data, []
        return self._replaced(self._bytes, data, lambda secret_id: marker(secret_id).encode())

    def _replaced(
        self, pattern: Any, data: AnyStr, marked: Callable[[str], AnyStr]
    ) -> tuple[AnyStr, list[str]]:
        found: set[str] = set()

        def replace(match: Any) -> AnyStr:
            found.add(secret_id := self._id(match))
            return marked(secret_id)

        return pattern.sub(replace, data), sorted(found)

    def find(self, text: str) -> list[str]:
        """The ids of the secrets ``text`` holds (sorted; none: ``[]``)."""
        if self._text is None:
            return []
        return sorted({self._id(m) for m in self._text.finditer(text)})

    def redact_head(self, data: bytes, cut: int) -> tuple[bytes, int, list[str]]:
        """``data[:cut]`` redacted, where ``cut`` moves past the end of a secret it would
        split: the redacted head, the cut used, and the ids replaced."""
        if self._bytes is None:
            return data[:cut], cut, []
        out: list[bytes] = []
        found: set[str] = set()
        at = 0
        for match in self._bytes.finditer(data):
            start, end = match.span()
            if start >= cut:
                break
            out += [data[at:start], marker(secret_id := self._id(match)).encode()]
            found.add(secret_id)
            at, cut = end, max(cut, end)
        out.append(data[at:cut])
        return b"".join(out), cut, sorted(found)

    def redact_error(self, error: QuillError) -> QuillError:
        """``error`` with its message and the text of its details redacted (errors often
        echo what was asked: ``File not found: <path>``)."""
        if not self:
            return error
        message, ids = self.redact(error.message)
        details, more = _redact_value(self, error.details)
        if not ids and not more:
            return error
        return QuillError(error.code, message, details)

    def redact_origin(self, origin: Origin | None) -> Origin | None:
        """``origin`` with its headers redacted (for the audit record of a refused request)."""
        if origin is None or not self:
            return origin
        fields = (origin.request_id, origin.actor, origin.session, origin.run)
        shown = [self.redact(v)[0] if v else v for v in fields]
        if shown == list(fields):
            return origin
        request_id, actor, session, run = shown
        return dataclasses.replace(
            origin, request_id=request_id or "", actor=actor, session=session, run=run
        )


def _redact_value(secrets: Secrets, value: Any) -> tuple[Any, bool]:
    """``value`` (a JSON-like tree) with every string in it redacted; whether any changed."""
    if isinstance(value, str):
        shown, ids = secrets.redact(value)
        return shown, bool(ids)
    if isinstance(value, dict):
        out: dict[Any, Any] = {}
        changed = False
        for k, v in value.items():
            (key, a), (item, b) = _redact_value(secrets, k), _redact_value(secrets, v)
            out[key] = item
            changed = changed or a or b
        return out, changed
    if isinstance(value, list | tuple):
        pairs = [_redact_value(secrets, v) for v in value]
        return [v for v, _ in pairs], any(c for _, c in pairs)
    return value, False


NO_SECRETS = Secrets()

CONTENT_FIELDS = frozenset(
    {"content", "data", "old_string", "new_string", "new_content", "replacement", "command"}
)
"""Request fields holding contents or a command line: redacted (the writer redacts what it
commits, the executor what a command prints), never refused. Every other string a request
holds names something and is refused when it holds a secret; so are ``env`` names (their
values are passed to the command and never logged)."""


def _strings(value: Any, field: str) -> Iterator[tuple[str, str]]:
    """Every ``(field, string)`` in a request body, but the ``CONTENT_FIELDS``."""
    if isinstance(value, str):
        yield field, value
    elif isinstance(value, msgspec.Struct):
        for name in value.__struct_fields__:
            if name not in CONTENT_FIELDS:
                yield from _strings(getattr(value, name), name)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings(item, field)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _strings(key, field)
            if field != "env":
                yield from _strings(item, field)


def refuse_names(
    secrets: Secrets,
    address: Address | None = None,
    origin: Origin | None = None,
    request: msgspec.Struct | None = None,
) -> None:
    """Refuse a request that names something with a registered secret: its subject's tenant
    or workspace, a ``Ws-*`` header, or any field of its body but the ``CONTENT_FIELDS``.

    Raises:
        QuillError: ``INVALID_ARGUMENT`` naming where and which secret ids (never the value).
    """
    if not secrets:
        return
    named: list[tuple[str, str]] = []
    if address is not None:
        named += [("the tenant name", address.tenant), ("the workspace name", address.workspace)]
    if origin is not None:
        named += [
            ("header Ws-Request-Id", origin.request_id),
            ("header Ws-Actor", origin.actor or ""),
            ("header Ws-Session", origin.session or ""),
            ("header Ws-Run", origin.run or ""),
        ]
    if request is not None:
        named += [(f"field {field!r}", text) for field, text in _strings(request, "")]
    for where, text in named:
        ids = secrets.find(text) if text else []
        if ids:
            raise QuillError(
                ErrorCode.INVALID_ARGUMENT,
                f"Refused: {where} holds a registered secret ({', '.join(ids)}); redacting it "
                "would change what it names",
                {"secrets": ids, "where": where},
            )


# ---------------------------------------------------------------- streams and logs


class StreamRedactor:
    """Redacts one output stream that arrives in chunks: holds back the last ``span - 1``
    bytes of what it was given, so that a secret split across two chunks is still whole when
    it is looked for; ``flush`` gives what is held at the end."""

    def __init__(self, secrets: Secrets) -> None:
        self.secrets = secrets
        self.redacted: set[str] = set()
        self._held = b""

    def feed(self, chunk: bytes) -> bytes:
        """What of the stream so far can be shown (redacted)."""
        data = self._held + chunk
        shown, cut, ids = self.secrets.redact_head(data, max(len(data) - self.secrets.span + 1, 0))
        self._held = data[cut:]
        self.redacted.update(ids)
        return shown

    def flush(self) -> bytes:
        """The rest of the stream (redacted)."""
        shown, _, ids = self.secrets.redact_head(self._held, len(self._held))
        self._held = b""
        self.redacted.update(ids)
        return shown
