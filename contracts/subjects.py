"""Every subject, stream, bucket, queue group and header name of the wire contract.

Nothing else in the code base spells a subject: build them here.

Subjects (root ``ws`` by default)::

    ws.cmd.<tenant>.<workspace>.<op>     mutations, request/reply, to the writer
    ws.qry.<tenant>.<workspace>.<op>     queries, request/reply, to the readers
    ws.exec.<tenant>.<workspace>.<op>    commands to run, to the executors
    ws.execout.<tenant>.<workspace>.<id> a running command's live output (id: its request id)
    ws.cmdout.<t>.<w>.<id>.<part>        a command's whole output, kept a while (stream WS_OUTPUT;
                                         read with exec.output, never by tenants directly)
    ws.approval.<t>.<w>.<id>.<part>      a request parked for approval and its outcome (stream
                                         WS_APPROVALS; services only: ``infra/approvals.py``)
    ws.evt.<tenant>.<workspace>          the event log (stream WS_EVENTS); only writers publish
    ws.updated.<tenant>.<workspace>      one message per committed change
    ws.purged.<tenant>.<workspace>       a workspace was purged (to the services only)
    ws.audit.<tenant>.<workspace>        one record per operation (stream WS_AUDIT)
    ws.replica.<instance>.<t>.<w>.<op>   a query addressed to one reader replica
    ws.exechold.<route>.<t>.<w>.<op>     a live command's input or signal, forwarded to the
                                         executor holding it (services only); ``port``: an
                                         HTTP request to a shell's port (``contracts/ports.py``);
                                         ``portws``: a websocket to it
    ws.execlist.<t>.<w>                  every executor lists its live commands (services only)
    ws.bridge.<tenant>.<op>              a bridge's claims (``infra/claims.py``): ``claim`` and
                                         ``release`` to a writer, ``seen`` to every service

On a cluster (writers with partitions), the NATS servers map every command subject to a
partition, ``ws.cmd.<t>.<w>.<op>`` → ``ws.cmdp.<p>.<t>.<w>.<op>`` (subject mapping
``partition()`` over tenant and workspace; ``Subjects.partition_mapping``); a writer
subscribes to the partitions it leases in ``WS_LEASES`` only. Clients keep sending to
``ws.cmd.…``. Each partition's epoch is a message on ``ws.fence.<p>`` in ``WS_EVENTS``.
"""

from __future__ import annotations

import functools
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from contracts.errors import ErrorCode, QuillError

STREAM_EVENTS = "WS_EVENTS"
STREAM_AUDIT = "WS_AUDIT"
STREAM_OUTPUT = "WS_OUTPUT"
STREAM_APPROVALS = "WS_APPROVALS"
"""Requests parked for approval, and what carrying them out gave (``infra/approvals.py``)."""
BUCKET_BLOBS = "WS_BLOBS"
BUCKET_LEASES = "WS_LEASES"
BUCKET_BRIDGES = "WS_BRIDGES"
BUCKET_SNAPSHOTS = "WS_SNAPSHOTS"
"""Object store of projection snapshots (``infra/snapshots.py``)."""
BUCKET_SNAPSHOT_LEASES = "WS_SNAPSHOT_LEASES"
"""KV bucket: who is making a snapshot (one replica at a time)."""
BUCKET_FORKS = "WS_FORKS"
"""KV bucket: per source ``<tenant>.<workspace>``, the forks standing on it and whether it is
being purged or scrubbed (``infra/fork_registry.py``)."""

QUEUE_WRITER = "quill-writer"
QUEUE_READER = "quill-reader"
QUEUE_EXECUTOR = "quill-executor"

HEADER_ACTOR = "Ws-Actor"
HEADER_SESSION = "Ws-Session"
HEADER_RUN = "Ws-Run"
HEADER_REQUEST_ID = "Ws-Request-Id"
HEADER_WAIT = "Ws-Wait"
"""On a command: how long (ms, at most ``MAX_WAIT_MS``) it may wait for another session's lock
to go, or for its approval on a restricted workspace, before ``LOCKED``/``APPROVAL_REQUIRED``."""
MAX_WAIT_MS = 600_000
HEADER_TIMEOUT = "Ws-Timeout"
"""On any request: how long (ms, at most ``MAX_WAIT_MS``) its client waits for the answer.
Expensive work for it (grep, diff, ``modify``'s regexes, a refused edit's closest-text search:
``infra/offload.py``) that has not started by then never starts, and what runs stops then.
The SDK sends it with every command and with ``COSTLY_QUERIES``."""
COSTLY_QUERIES = frozenset({"grep", "diff"})
"""Queries whose work a client can make expensive (the SDK says how long it waits for them)."""
CHANGES_SUFFIX = ":changes"
"""Request id of an executor's ``apply`` = the command's request id + this (on a restricted
workspace the command's approval covers it)."""
HEADER_EVENT_HASH = "Ws-Event-Hash"
"""On every event message: the event's own hash, sha256 (hex) of the message payload."""
HEADER_STREAM = "Ws-Stream"
"""On a live output message: ``stdout``, ``stderr``, ``heartbeat`` or ``eof`` (the last)."""
HEADER_SEQ = "Ws-Seq"
"""On a live output message: its number, from 1, so that a gap shows."""

TENANT_SCOPE = "_"
"""The workspace token of a tenant's own ops (``ws.qry.<tenant>._.workspaces``): never a
workspace id (ids start with a letter or digit)."""

ID_PATTERN = r"[a-z0-9][a-z0-9_-]{0,63}"
_ID_RE = re.compile(ID_PATTERN + r"\Z")
_OP_RE = re.compile(r"[a-z][a-z0-9_]{0,63}\Z")
HEADER_VALUE_MAX = 256
_REQUEST_ID_RE = re.compile(r"[A-Za-z0-9._:-]{1,128}\Z")


def check_id(kind: str, value: str) -> str:
    """Check a tenant or workspace id.

    Raises:
        QuillError: ``INVALID_ARGUMENT`` if ``value`` is not ``[a-z0-9][a-z0-9_-]{0,63}``.
    """
    if not _ID_RE.match(value):
        raise QuillError(
            ErrorCode.INVALID_ARGUMENT,
            f"Invalid {kind} id {value!r}: use 1-64 of a-z, 0-9, '_' and '-', "
            "starting with a letter or digit",
            {kind: value},
        )
    return value


def check_request_id(value: str) -> str:
    """Check a ``Ws-Request-Id`` value (it becomes part of a JetStream ``Nats-Msg-Id``)."""
    if not _REQUEST_ID_RE.match(value):
        raise QuillError(
            ErrorCode.INVALID_ARGUMENT,
            "Invalid Ws-Request-Id: use 1-128 of A-Z a-z 0-9 . _ : -",
        )
    return value


def new_request_id() -> str:
    """A fresh request id, for a request that came without ``Ws-Request-Id``: 32 hex digits
    (a valid ``Ws-Request-Id``, so that it can name the event, the audit record and the
    executor's ``apply``, which adds ``CHANGES_SUFFIX``). The one generator every service uses."""
    return uuid.uuid4().hex


def _generated_id(value: object) -> str:
    """What a ``new_id`` generator returned, as a request id: ``bytes`` (``NUID.next``) are
    decoded, never shown as their repr; ``-`` (a ``UUID``'s) dropped.

    Raises:
        ValueError: the generator made something that is not a valid request id (a bug).
    """
    if isinstance(value, bytes | bytearray | memoryview):
        text = bytes(value).decode("ascii", "replace")
    else:
        text = str(value)
    text = text.replace("-", "")
    if not _REQUEST_ID_RE.match(text):
        raise ValueError(f"Generated request id {text!r} is not a valid Ws-Request-Id")
    return text


def split_workspace(name: str) -> tuple[str, str]:
    """Split ``tenant/workspace``.

    Raises:
        QuillError: ``INVALID_ARGUMENT`` when the name is not ``tenant/workspace``.
    """
    parts = name.split("/")
    if len(parts) != 2:
        raise QuillError(
            ErrorCode.INVALID_ARGUMENT,
            f"Invalid workspace name {name!r}: expected tenant/workspace",
        )
    return check_id("tenant", parts[0]), check_id("workspace", parts[1])


@dataclass(frozen=True, slots=True)
class Origin:
    """Who asked and on whose behalf, from the ``Ws-*`` request headers."""

    request_id: str
    actor: str | None = None
    session: str | None = None
    run: str | None = None
    wait_ms: int = 0
    """``Ws-Wait``: how long a command may wait for a lock or an approval."""
    generated: bool = False
    """The request id was made here (``new_id``: no ``Ws-Request-Id``): no earlier request
    had it, so it cannot be a retry (the writer looks no result up for it)."""
    timeout_ms: int = 0
    """``Ws-Timeout``: how long the client waits for the answer (0: it did not say)."""

    @classmethod
    def from_headers(
        cls, headers: Mapping[str, str] | None, new_id: Callable[[], object] | None = None
    ) -> Origin:
        """Read the ``Ws-*`` headers; ``new_id()`` names a request without ``Ws-Request-Id``
        (default: ``""``, for queries, which need no idempotency key). Services pass
        ``new_request_id``; what any other generator returns is made a valid id the same way
        (``bytes`` decoded, ``-`` dropped), so a request without the header works exactly like
        one with it.

        Raises:
            QuillError: ``INVALID_ARGUMENT`` for a malformed request id or an over-long value.
        """
        headers = headers or {}
        values: dict[str, str | None] = {}
        for header in (HEADER_ACTOR, HEADER_SESSION, HEADER_RUN):
            value = headers.get(header)
            if value is not None and len(value) > HEADER_VALUE_MAX:
                raise QuillError(
                    ErrorCode.INVALID_ARGUMENT,
                    f"Header {header} is longer than {HEADER_VALUE_MAX} characters",
                )
            values[header] = value or None
        request_id = headers.get(HEADER_REQUEST_ID)
        wait = headers.get(HEADER_WAIT)
        timeout = headers.get(HEADER_TIMEOUT)
        for name, value in ((HEADER_WAIT, wait), (HEADER_TIMEOUT, timeout)):
            if value is not None and not (value.isdecimal() and len(value) <= 7):
                raise QuillError(ErrorCode.INVALID_ARGUMENT, f"{name} must be milliseconds")
        return cls(
            request_id=check_request_id(request_id)
            if request_id
            else (_generated_id(new_id()) if new_id else ""),
            actor=values[HEADER_ACTOR],
            session=values[HEADER_SESSION],
            run=values[HEADER_RUN],
            wait_ms=min(int(wait), MAX_WAIT_MS) if wait else 0,
            generated=not request_id and new_id is not None,
            timeout_ms=min(int(timeout), MAX_WAIT_MS) if timeout else 0,
        )

    def headers(self) -> dict[str, str]:
        out = {HEADER_REQUEST_ID: self.request_id}
        for header, value in (
            (HEADER_ACTOR, self.actor),
            (HEADER_SESSION, self.session),
            (HEADER_RUN, self.run),
        ):
            if value:
                out[header] = value
        if self.wait_ms:
            out[HEADER_WAIT] = str(self.wait_ms)
        if self.timeout_ms:
            out[HEADER_TIMEOUT] = str(self.timeout_ms)
        return out


@dataclass(frozen=True, slots=True)
class Address:
    """Where a request was sent: its kind (cmd/qry/exec), tenant, workspace and op."""

    kind: str
    tenant: str
    workspace: str
    op: str


@dataclass(frozen=True)
class Subjects:
    """Subject builders for one deployment (``root`` is configurable)."""

    root: str = "ws"

    def cmd(self, tenant: str, workspace: str, op: str) -> str:
        return f"{self.root}.cmd.{tenant}.{workspace}.{op}"

    def qry(self, tenant: str, workspace: str, op: str) -> str:
        return f"{self.root}.qry.{tenant}.{workspace}.{op}"

    def exec(self, tenant: str, workspace: str, op: str) -> str:
        return f"{self.root}.exec.{tenant}.{workspace}.{op}"

    def execout(self, tenant: str, workspace: str, request_id: str) -> str:
        """Where a command's live output goes: one subject token made of its request id."""
        return f"{self.root}.execout.{tenant}.{workspace}.{request_id.replace('.', '_')}"

    def cmdout(self, tenant: str, workspace: str, request_id: str, part: str) -> str:
        """A part of a command's kept output in ``WS_OUTPUT``: ``stdout.<n>``/``stderr.<n>``
        (its n-th chunk) or ``end`` (what was kept, written when the command ended)."""
        return f"{self.root}.cmdout.{tenant}.{workspace}.{request_id.replace('.', '_')}.{part}"

    def workspace_cmdout(self, tenant: str, workspace: str) -> str:
        """Every part of every kept command output of a workspace."""
        return f"{self.root}.cmdout.{tenant}.{workspace}.>"

    @property
    def all_cmdout(self) -> str:
        return f"{self.root}.cmdout.>"

    def approval(self, tenant: str, workspace: str, approval_id: str, part: str) -> str:
        """A part of a parked request in ``WS_APPROVALS``: ``request`` (what to carry out),
        ``claim`` (an executor took it), ``outcome`` (what carrying it out gave)."""
        return f"{self.root}.approval.{tenant}.{workspace}.{approval_id.replace('.', '_')}.{part}"

    def workspace_approvals(self, tenant: str, workspace: str) -> str:
        return f"{self.root}.approval.{tenant}.{workspace}.>"

    @property
    def all_approvals(self) -> str:
        return f"{self.root}.approval.>"

    def evt(self, tenant: str, workspace: str) -> str:
        return f"{self.root}.evt.{tenant}.{workspace}"

    def purged(self, tenant: str, workspace: str) -> str:
        """Where the writer says a workspace was purged (executors drop their checkouts)."""
        return f"{self.root}.purged.{tenant}.{workspace}"

    @property
    def all_purged(self) -> str:
        return f"{self.root}.purged.*.*"

    def updated(self, tenant: str, workspace: str) -> str:
        return f"{self.root}.updated.{tenant}.{workspace}"

    def audit(self, tenant: str, workspace: str) -> str:
        return f"{self.root}.audit.{tenant}.{workspace}"

    def replica(self, instance: str, tenant: str, workspace: str, op: str) -> str:
        return f"{self.root}.replica.{instance}.{tenant}.{workspace}.{op}"

    def exec_holder(self, route: str, tenant: str, workspace: str, op: str) -> str:
        """An op on a live command, forwarded to the executor whose ``route`` its id names
        (``services/executor/live.py``); tenants may not publish here."""
        return f"{self.root}.exechold.{route}.{tenant}.{workspace}.{op}"

    def all_exec_holder(self, route: str) -> str:
        return self.exec_holder(route, "*", "*", "*")

    def exec_list(self, tenant: str, workspace: str) -> str:
        """Every executor answers with the workspace's live commands it holds."""
        return f"{self.root}.execlist.{tenant}.{workspace}"

    @property
    def all_exec_list(self) -> str:
        return self.exec_list("*", "*")

    def request(self, kind: str, tenant: str, workspace: str, op: str) -> str:
        return f"{self.root}.{kind}.{tenant}.{workspace}.{op}"

    # Wildcards a service subscribes to, and the streams' subject filters.
    @property
    def all_cmd(self) -> str:
        return f"{self.root}.cmd.*.*.*"

    def cmd_partition(self, partition: int) -> str:
        """What a writer holding ``partition`` subscribes to (commands after mapping)."""
        return f"{self.root}.cmdp.{partition}.*.*.*"

    def cmd_mapped(self, tenant: str, workspace: str) -> str:
        """A workspace's commands once a cluster's mapping put them in a partition."""
        return f"{self.root}.cmdp.*.{tenant}.{workspace}.*"

    @staticmethod
    def partition_of(tenant: str, workspace: str, partitions: int) -> int:
        """The partition the servers' mapping puts a workspace in: nats-server's
        ``partition()`` transform, FNV-1a (32 bits) of the tokens concatenated, modulo."""
        digest = 0x811C9DC5
        for byte in f"{tenant}{workspace}".encode():
            digest = ((digest ^ byte) * 0x01000193) & 0xFFFFFFFF
        return digest % partitions

    def partition_mapping(self, partitions: int) -> dict[str, str]:
        """The NATS server ``mappings`` entry that spreads commands over ``partitions``."""
        return {
            self.all_cmd: f"{self.root}.cmdp.{{{{partition({partitions},1,2)}}}}"
            ".{{wildcard(1)}}.{{wildcard(2)}}.{{wildcard(3)}}"
        }

    def fence(self, partition: int) -> str:
        """Subject (in ``WS_EVENTS``) of a partition's epochs; appends are fenced on it."""
        return f"{self.root}.fence.{partition}"

    @property
    def all_fence(self) -> str:
        return f"{self.root}.fence.*"

    @property
    def all_qry(self) -> str:
        return f"{self.root}.qry.*.*.*"

    @property
    def all_exec(self) -> str:
        return f"{self.root}.exec.*.*.*"

    @property
    def all_evt(self) -> str:
        return f"{self.root}.evt.>"

    @property
    def all_audit(self) -> str:
        return f"{self.root}.audit.>"

    def all_replica(self, instance: str) -> str:
        return f"{self.root}.replica.{instance}.*.*.*"

    def bridge(self, tenant: str, op: str) -> str:
        """A bridge's request about its tenant's claims (``infra/claims.py``)."""
        return f"{self.root}.bridge.{tenant}.{op}"

    def parse_bridge(self, subject: str) -> str | None:
        """The tenant of a ``bridge`` subject (None: not one)."""
        parts = subject.split(".")
        if len(parts) != 4 or parts[0] != self.root or parts[1] != "bridge":
            return None
        return parts[2] if _ID_RE.match(parts[2]) else None

    def snapshot(self, role: str) -> str:
        """Ask one ``role`` replica (a queue group) to snapshot its projection now."""
        return f"{self.root}.sys.snapshot.{role}"

    def parse_request(self, subject: str) -> Address:
        """Parse a cmd/qry/exec (or replica) subject into its address.

        Raises:
            QuillError: ``INVALID_ARGUMENT`` if a token is malformed.
        """
        return _parse_request(self.root, subject)

    def parse_workspace_subject(self, subject: str) -> tuple[str, str]:
        """``ws.evt.t.w`` / ``ws.audit.t.w`` / ``ws.updated.t.w`` → ``(t, w)``."""
        parts = subject.split(".")
        if len(parts) != 4:
            raise QuillError(ErrorCode.INVALID_ARGUMENT, f"Not a workspace subject: {subject}")
        return parts[2], parts[3]

    def msg_id(self, tenant: str, workspace: str, request_id: str) -> str:
        """The JetStream ``Nats-Msg-Id`` of the event a request produces."""
        return f"{tenant}/{workspace}/{request_id}"


@functools.lru_cache(maxsize=16384)
def _parse_request(root: str, subject: str) -> Address:
    """``Subjects.parse_request``, remembered per subject (a busy service sees the same few
    thousand subjects over and over; an ``Address`` is immutable). Errors are not cached."""
    parts = subject.split(".")
    if len(parts) == 6 and parts[1] == "replica":
        parts = [parts[0], "qry", *parts[3:]]
    elif len(parts) == 6 and parts[1] == "cmdp":
        parts = [parts[0], "cmd", *parts[3:]]
    if len(parts) != 5 or parts[0] != root:
        raise QuillError(ErrorCode.INVALID_ARGUMENT, f"Not a Quill request subject: {subject}")
    _, kind, tenant, workspace, op = parts
    check_id("tenant", tenant)
    if workspace != TENANT_SCOPE:
        check_id("workspace", workspace)
    if not _OP_RE.match(op):
        raise QuillError(ErrorCode.INVALID_ARGUMENT, f"Invalid op name {op!r}")
    return Address(kind, tenant, workspace, op)
