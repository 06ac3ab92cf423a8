"""Hypothesis strategies for every op of ``contracts/ops.py``, built from the published JSON
Schemas in ``docs/schemas/`` (valid requests), and mutations of them (hostile requests).

``hypothesis-jsonschema`` (0.23.1, the last release) does not work with our Hypothesis (6.170:
``'many' object has no attribute 'more'`` on the first draw), so the few keywords our schemas use
(``$ref``, ``anyOf``, ``enum``, ``type``, lengths, bounds, ``pattern``, ``items``,
``properties``/``required``/``additionalProperties``, ``maxProperties``/``propertyNames``) are
turned into strategies here. Generated sizes are kept small (the schemas allow 8 MiB strings);
the ``huge`` and ``deep`` mutations go to the limits on purpose.

A case is a ``Case``: the raw payload bytes, the headers, and a ``kind`` naming the mutation, so
that a failure is reported (and, while a fix is pending, tolerated in ``KNOWN``) by op and kind.
"""

from __future__ import annotations

import base64
import itertools
import json
import unicodedata
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from contracts.ops import OPS, OpSpec

SCHEMAS = Path(__file__).resolve().parents[2] / "docs" / "schemas"

SEEDED_FILES = ("a.txt", "dir/b.txt", "dir/sub/c.md", "bin.dat")
"""Files every fuzzed workspace starts with (``conftest.seed``), so that valid requests often
name something that exists."""
SEEDED_DIRS = ("dir", "dir/sub", "empty")

PATH_FIELDS = frozenset(
    {"path", "to", "workdir", "source", "destination", "prefix", "workingDirectory"}
)
"""Request fields holding a workspace path: drawn from the seeded names as well."""

HOSTILE_PATHS: dict[str, str] = {
    "dotdot": "../etc/passwd",
    "absolute-outside": "/etc/passwd",
    "dotdot-deep": "dir/../../x",
    "workspace-root": "/workspace",
    "nul": "a\x00b.txt",
    "newline": "a\nb.txt",
    "control": "a\x07\x1bb.txt",
    "bidi": "a\u202etxt.exe",
    "zero-width": "a\u200bb.txt",
    "decomposed": unicodedata.normalize("NFD", "caf\u00e9.txt"),
    "trailing-slash": "dir2/",
    "long-name": "n" * 300,
    "long-path": "/".join(["d" * 200] * 30),
    "dot": ".",
    "empty": "",
    "backslash": "..\\..\\x",
    "surrogate-escape": "\udcff.txt",
}
"""Paths a careless or hostile client sends, by name (the name is part of the case's kind)."""


@dataclass(frozen=True, repr=False)
class Case:
    """One request: what is sent, and which mutation made it (``valid`` if none)."""

    kind: str
    payload: bytes
    headers: dict[str, str] = field(default_factory=dict)
    body: Any = None
    """The JSON value before encoding (``None`` when the payload is not JSON)."""

    def show(self) -> str:
        text = self.payload[:300].decode("utf-8", "backslashreplace")
        more = "..." if len(self.payload) > 300 else ""
        return f"kind={self.kind} headers={self.headers} payload={text}{more}"

    def __repr__(self) -> str:  # Hypothesis prints it: keep megabyte payloads out
        return f"Case({self.show()!r})"


@cache
def request_schema(key: str) -> dict[str, Any]:
    """The published JSON Schema of op ``key``'s request."""
    return dict(json.loads((SCHEMAS / f"{key}.request.json").read_text()))


@cache
def reply_schema(key: str) -> dict[str, Any]:
    """The published JSON Schema of op ``key``'s reply envelope."""
    return dict(json.loads((SCHEMAS / f"{key}.reply.json").read_text()))


# -- schema -> strategy ---------------------------------------------------------------------

MAX_TEXT = 24
MAX_ITEMS = 3
_CHARS = st.characters(codec="utf-8", exclude_categories=("Cs", "Cc", "Cf", "Zl", "Zp", "Co", "Cn"))
"""Printable text for valid requests (control and invisible characters are mutations)."""
_TEXT = st.text(_CHARS, max_size=MAX_TEXT)


def _resolve(root: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        ref = node["$ref"]
        assert ref.startswith("#/$defs/"), ref
        node = root["$defs"][ref.removeprefix("#/$defs/")]
    return node


def _integer(node: dict[str, Any]) -> st.SearchStrategy[int]:
    low, high = node.get("minimum"), node.get("maximum")
    # mostly small numbers (the interesting ones), sometimes the bounds themselves
    small = st.integers(
        max(low, -5) if low is not None else -5, min(high, 64) if high is not None else 64
    )
    bounds = [b for b in (low, high) if b is not None]
    if (low is not None and low > 64) or (high is not None and high < -5):
        return st.integers(low, high)
    if not bounds:
        return small
    edge = st.sampled_from(bounds)
    return st.integers(0, 7).flatmap(lambda i: edge if i == 0 else small)


def _string(name: str, node: dict[str, Any]) -> st.SearchStrategy[str]:
    low, high = node.get("minLength", 0), node.get("maxLength")
    if "pattern" in node:
        pattern = node["pattern"]
        return st.from_regex(pattern, fullmatch=True).filter(
            lambda s: len(s) >= low and (high is None or len(s) <= high)
        )
    most = min(high, MAX_TEXT) if high is not None else MAX_TEXT
    text = st.text(_CHARS, min_size=low, max_size=most)
    if name in PATH_FIELDS:
        named = st.sampled_from(SEEDED_FILES + SEEDED_DIRS + ("new.txt", "dir/new.md"))
        return (named | text).filter(lambda s: len(s) >= low)
    return text


def from_schema(
    root: dict[str, Any], node: dict[str, Any] | None = None, name: str = ""
) -> st.SearchStrategy[Any]:
    """A strategy for the JSON values ``node`` (default: the schema itself) accepts."""
    node = _resolve(root, root if node is None else node)
    for alternatives in ("anyOf", "oneOf"):  # ours are disjoint (a tag, or distinct types)
        if alternatives in node:
            return st.one_of([from_schema(root, o, name) for o in node[alternatives]])
    if "const" in node:
        return st.just(node["const"])
    if "enum" in node:
        return st.sampled_from(node["enum"])
    kind = node.get("type", "string" if "pattern" in node else None)
    if kind is None and "properties" in node:
        kind = "object"
    if kind == "null":
        return st.none()
    if kind == "boolean":
        return st.booleans()
    if kind == "integer":
        return _integer(node)
    if kind == "number":
        return st.floats(allow_nan=False, allow_infinity=False)
    if kind == "string":
        if node.get("contentEncoding") == "base64":
            return st.binary(max_size=16).map(lambda b: base64.b64encode(b).decode())
        return _string(name, node)
    if kind == "array":
        low = node.get("minItems", 0)
        high = min(node.get("maxItems", MAX_ITEMS), max(MAX_ITEMS, low))
        return st.lists(from_schema(root, node.get("items", {}), name), min_size=low, max_size=high)
    if kind == "object":
        return _object(root, node)
    raise AssertionError(f"no strategy for schema node {node}")


def _object(root: dict[str, Any], node: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    properties: dict[str, Any] = node.get("properties", {})
    if not properties:
        extra = node.get("additionalProperties", False)
        if isinstance(extra, dict):  # a map (e.g. ``env``)
            keys = (
                from_schema(root, node["propertyNames"])
                if "propertyNames" in node
                else _TEXT.filter(bool)
            )
            most = min(node.get("maxProperties", MAX_ITEMS), MAX_ITEMS)
            return st.dictionaries(keys, from_schema(root, extra), max_size=most)
        return st.just({})
    required = set(node.get("required", ()))
    return st.fixed_dictionaries(
        {k: from_schema(root, v, k) for k, v in properties.items() if k in required},
        optional={k: from_schema(root, v, k) for k, v in properties.items() if k not in required},
    )


# -- per-op narrowing: keep valid requests fast and harmless --------------------------------

EXEC_COMMANDS = (
    "echo hi",
    "echo hi > out.txt",
    "ls -la",
    "cat a.txt",
    "printf '\\x00\\xff' > raw.bin",
    "mkdir -p made && touch made/x",
    "rm -f a.txt",
    "false",
    "exit 3",
    "touch \"$(printf 'bad\\377name')\" ok-after-bad.txt",
    "touch \"$(printf 'new\\nline')\" ok-after-newline.txt",
    "ln -s /etc/passwd link && echo linked",
    "echo spam; echo more >&2",
)


def narrow(key: str, body: dict[str, Any]) -> dict[str, Any]:
    """Bound what would make a valid request slow by design (long commands, long waits)."""
    body = dict(body)
    if key == "exec.run":
        body["command"] = body.get("command") or "echo hi"
        if len(body["command"]) % 3 or not body["command"].isascii():  # most: a real command
            body["command"] = EXEC_COMMANDS[len(body["command"]) % len(EXEC_COMMANDS)]
        body["timeout_ms"] = min(body.get("timeout_ms") or 2000, 2000)
        if "timeout" in body:  # WAP's name for it
            body["timeout"] = min(body["timeout"] or 2000, 2000)
    if key == "exec.git":
        body["timeout_ms"] = min(body.get("timeout_ms") or 2000, 2000)
        if body.get("url") is not None:
            body["url"] = "/nonexistent/repo"
    if key == "cmd.attach":
        uri = body.get("uri", "")
        body["uri"] = uri if ":" not in uri else "server:/fuzz/attached"
    if key == "cmd.lock" and body.get("ttl_ms") is not None:
        body["ttl_ms"] = min(body["ttl_ms"], 2000)
    if key == "cmd.request_approval" and body.get("timeout_ms") is not None:
        body["timeout_ms"] = min(body["timeout_ms"], 1000)
    return body


# -- headers ------------------------------------------------------------------------------

_REQUEST_IDS = itertools.count(1)
"""Request ids are numbered, not drawn: Hypothesis repeats values on purpose."""
_HEADER_TEXT = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=12)


@st.composite
def valid_headers(draw: st.DrawFn, spec: OpSpec) -> dict[str, str]:
    """Documented headers: a request id on commands (sometimes none), maybe actor/session."""
    headers: dict[str, str] = {}
    if spec.kind != "qry" and draw(st.integers(0, 3)):
        # unique: a reused id answers with the first request's reply, whatever its op (the
        # documented idempotency), which a concurrent mix of ops would take for a wrong reply
        headers["Ws-Request-Id"] = f"fz{next(_REQUEST_IDS)}" + draw(
            st.from_regex(r"[A-Za-z0-9._:-]{0,20}", fullmatch=True)
        )
    if draw(st.booleans()):
        headers["Ws-Actor"] = draw(_HEADER_TEXT.filter(bool))
    if draw(st.booleans()):
        headers["Ws-Session"] = draw(st.sampled_from(["s1", "s2"]))
    return headers


PRECONDITIONS = ("expected_version", "if_match")


@st.composite
def valid(draw: st.DrawFn, spec: OpSpec) -> Case:
    """Schema-valid requests of op ``spec`` with documented headers (preconditions, which
    mostly make a request fail with ``CONFLICT``, only in one request out of four)."""
    body = narrow(spec.key, draw(from_schema(request_schema(spec.key))))
    if draw(st.integers(0, 3)):
        for name in PRECONDITIONS:
            body.pop(name, None)
    return Case("valid", json.dumps(body).encode(), draw(valid_headers(spec)), body)


# -- mutations ------------------------------------------------------------------------------


def _fields(schema: dict[str, Any]) -> tuple[dict[str, Any], set[str]]:
    node = _resolve(schema, schema)
    return node.get("properties", {}), set(node.get("required", ()))


_WRONG_VALUES: tuple[Any, ...] = (None, True, -1, 2**70, 1.5, "x", [], {}, [1, "a"], {"a": 1})
RAW = ("deep-raw", "invalid-utf8", "not-object", "bad-header")
"""Mutations only a raw transport can send (the bus; MCP and REST send them their own way)."""


@st.composite
def mutated_body(
    draw: st.DrawFn, schema: dict[str, Any], key: str, raw: bool = True
) -> tuple[str, Any, bytes | None]:
    """A valid body for ``schema`` (of op ``key``), then one mutation: (kind, body, and the
    raw payload when the mutation is not JSON)."""
    base: dict[str, Any] = narrow(key, draw(from_schema(schema)))
    properties, required = _fields(schema)
    names = sorted(properties)
    choices = ["extra-field", "huge-string", "deep", "control-chars"]
    if raw:
        choices += ["deep-raw", "not-object"]
    if names:
        choices += ["wrong-type", "huge-number", "hostile-path"]
        if raw:
            choices.append("invalid-utf8")
    if required:
        choices.append("missing-field")
    what = draw(st.sampled_from(choices))
    body: dict[str, Any] = dict(base)
    kind = what
    if what == "wrong-type":
        name = draw(st.sampled_from(names))
        body[name] = draw(st.sampled_from(_WRONG_VALUES))
        kind = f"wrong-type:{name}"
    elif what == "missing-field":
        name = draw(st.sampled_from(sorted(required)))
        body.pop(name, None)
        kind = f"missing-field:{name}"
    elif what == "extra-field":
        body[draw(st.sampled_from(["bogus", "__proto__", "Path", ""]))] = 1
    elif what == "huge-string":
        strings = [n for n in names if _accepts(properties[n], "string")] or ["bogus"]
        name = draw(st.sampled_from(strings))
        body[name] = "x" * draw(st.sampled_from([70_000, 1_100_000]))
        kind = f"huge-string:{name}"
    elif what == "huge-number":
        name = draw(st.sampled_from(names))
        body[name] = draw(st.sampled_from([2**63, -(2**63) - 1, 10**400, -1]))
        kind = f"huge-number:{name}"
    elif what == "deep":
        # through a client library (MCP) only as deep as it serialises; the bus goes deeper
        depth = draw(st.sampled_from([64, 500] if raw else [16, 64]))
        value: Any = []
        for _ in range(depth):
            value = [value]
        name = draw(st.sampled_from(names or ["bogus"]))
        body[name] = value
        kind = f"deep:{name}"
    elif what == "deep-raw":
        depth = draw(st.sampled_from([1000, 100_000]))
        payload = json.dumps(body)[:-1].encode()
        if body:
            payload += b", "
        payload += b'"deep": ' + b"[" * depth + b"]" * depth + b"}"
        return f"deep-raw:{depth}", None, payload
    elif what == "control-chars":
        strings = [n for n in names if _accepts(properties[n], "string")] or ["bogus"]
        name = draw(st.sampled_from(strings))
        body[name] = draw(st.sampled_from(["\x00", "a\x00b", "\x1b[31m", "\r\n", "\x7f"]))
        kind = f"control-chars:{name}"
    elif what == "hostile-path":
        paths = [n for n in names if n in PATH_FIELDS] or names[:1]
        name = draw(st.sampled_from(paths))
        # a lone surrogate cannot be encoded by a client library (MCP): raw transports only
        label = draw(st.sampled_from([n for n in sorted(HOSTILE_PATHS) if raw or "surr" not in n]))
        body[name] = HOSTILE_PATHS[label]
        kind = f"hostile-path:{label}"
    elif what == "invalid-utf8":
        name = draw(st.sampled_from(names))
        body[name] = "@@BAD@@"
        return "invalid-utf8", None, json.dumps(body).encode().replace(b"@@BAD@@", b"\xff\xfe\xc3(")
    elif what == "not-object":
        raw_body = draw(
            st.sampled_from([b"[]", b'"x"', b"null", b"1", b"{", b"\xff", b"{}}", b" "])
        )
        return "not-object", None, raw_body
    return kind, body, None


@st.composite
def mutated(draw: st.DrawFn, spec: OpSpec) -> Case:
    """A valid request of ``spec`` over the bus, then one mutation (its ``kind`` says which),
    of the body or of a header."""
    headers = draw(valid_headers(spec))
    if draw(st.integers(0, 5)) == 0:
        header, value = draw(st.sampled_from(BAD_HEADERS))
        body = narrow(spec.key, draw(from_schema(request_schema(spec.key))))
        return Case(
            f"bad-header:{header}", json.dumps(body).encode(), {**headers, header: value}, body
        )
    kind, body, payload = draw(mutated_body(request_schema(spec.key), spec.key))
    if payload is None:
        payload = json.dumps(body).encode()
    return Case(kind, payload, headers, body)


def _accepts(node: dict[str, Any], kind: str) -> bool:
    if node.get("type") == kind:
        return True
    return any(option.get("type") == kind for option in node.get("anyOf", ()))


BAD_HEADERS: tuple[tuple[str, str], ...] = (
    ("Ws-Request-Id", "has space"),
    ("Ws-Request-Id", "x" * 200),
    ("Ws-Request-Id", "caf\u00e9"),
    ("Ws-Actor", "a" * 300),
    ("Ws-Session", "s" * 300),
    ("Ws-Run", "no-such-run"),
    ("Ws-Wait", "soon"),
    ("Ws-Wait", "-1"),
    ("Ws-Wait", "99999999999"),
    ("Ws-Timeout", "soon"),
    ("Ws-Timeout", "-1"),
    ("Ws-Timeout", "99999999999"),
)


def any_case(spec: OpSpec) -> st.SearchStrategy[Case]:
    """Valid or mutated requests of op ``spec``."""
    return valid(spec) | mutated(spec)


STRATEGIES: dict[str, st.SearchStrategy[Case]] = {key: any_case(spec) for key, spec in OPS.items()}
"""Every op's strategy (the coverage test checks none is missing)."""


# -- fixed hostile payloads, sent to every op ---------------------------------------------

FIXED: dict[str, tuple[bytes, dict[str, str]]] = {
    "empty": (b"", {}),
    "not-json": (b"{nope", {}),
    "array": (b"[]", {}),
    "string": (b'"x"', {}),
    "invalid-utf8": (b'{"path": "\xff\xfe\xc3(", "content": "\xff"}', {}),
    "invalid-utf8-key": (b'{"\xff": 1}', {}),
    "deep-100k": (b'{"path": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", {}),
    "nul-everywhere": (b'{"path": "\\u0000", "pattern": "\\u0000", "command": "\\u0000"}', {}),
    "lone-surrogate": (b'{"path": "\\udcff", "pattern": "\\ud800"}', {}),
    "no-request-id": (b"{}", {}),
    "bad-request-id": (b"{}", {"Ws-Request-Id": "bad id!"}),
    "unknown-run": (b"{}", {"Ws-Run": "no-such-run"}),
    "huge-header": (b"{}", {"Ws-Actor": "a" * 4000}),
}
"""Payloads and headers sent to every op, by name (kind ``fixed:<name>``)."""

UNKNOWN_RUN = "no-such-run"
EXAMPLE_CASES = ("example", "example-outside", "example-nul", "example-unknown-run")
"""Cases made from each op's documented example (``contracts/ops.py``): as it is, with every
path outside the workspace, with a NUL in every string, in a run that does not exist."""


def from_example(spec: OpSpec, name: str) -> Case:
    """The case ``name`` (one of ``EXAMPLE_CASES``) of op ``spec``'s documented example."""
    body: dict[str, Any] = narrow(spec.key, dict(spec.example))
    if "command" in spec.example:  # the documented command, not one of ours
        body["command"] = spec.example["command"]
    headers: dict[str, str] = {}
    properties, _ = _fields(request_schema(spec.key))
    if name == "example-outside":
        named = [f for f in properties if f in PATH_FIELDS and f != "prefix"]
        for field_name in named:
            body[field_name] = "../outside"
    elif name == "example-nul":
        body = {k: (v + "\x00" if isinstance(v, str) else v) for k, v in body.items()}
    elif name == "example-unknown-run":
        headers["Ws-Run"] = UNKNOWN_RUN
    return Case(f"fixed:{name}", json.dumps(body).encode(), headers, body)
