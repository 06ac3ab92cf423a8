"""Local workspaces: which ``tenant/workspace`` names a bridge (``quill attach``) answers for.

A bridge serves a folder on someone's machine on the same subjects as a server workspace. Its
name is claimed in the KV bucket ``WS_BRIDGES`` (key ``<tenant>.<workspace>``, value a
``Claim``) and renewed every ``RENEW_S``, by a writer the bridge asks (``infra/claims.py``:
a tenant never writes the bucket itself); a claim not renewed for ``CLAIM_TTL_S`` lapses.
The writer, readers and executors watch the bucket and stay silent on a claimed workspace's
subjects, so that the bridge's answer is the only one. A bridge may only claim a
name the log does not hold, and the writer refuses to create one that is claimed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time

import msgspec
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType
from nats.js.errors import BucketNotFoundError, KeyWrongLastSequenceError, NotFoundError
from nats.js.kv import KeyValue

from contracts.errors import ErrorCode, QuillError
from contracts.subjects import BUCKET_BRIDGES
from infra import assets

log = logging.getLogger("quill.bridges")

CLAIM_TTL_S = 30.0
RENEW_S = 10.0
MAX_CLAIM_BYTES = 4096
SWEEP_S = CLAIM_TTL_S
"""How often the watchers forget lapsed claims (``Bridges._sweep``)."""
STREAM_BRIDGES = f"KV_{BUCKET_BRIDGES}"


class Claim(msgspec.Struct, frozen=True, kw_only=True):
    """Who answers for a local workspace, until when."""

    owner: str
    """The bridge's instance id."""
    client: str
    """The name of the machine or client it runs on (the host part of its URI)."""
    path: str
    """The folder it serves, as its user named it."""
    expires: float
    """Unix time after which the claim has lapsed unless renewed."""

    @property
    def live(self) -> bool:
        return self.expires > time.time()


_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(Claim).decode


def size(claim: Claim) -> int:
    """Bytes the claim takes in the bucket (a tenant's quota counts them)."""
    return len(_encode(claim))


def decode(value: bytes) -> Claim:
    """A stored claim.

    Raises:
        msgspec.DecodeError: not one.
    """
    return _decode(value)


def key(tenant: str, workspace: str) -> str:
    return f"{tenant}.{workspace}"


async def bucket(js: JetStreamContext, replicas: int = 1) -> KeyValue:
    """The WS_BRIDGES bucket, created if missing, its configuration corrected (idempotent,
    and safe when several services do it at once: ``infra/assets.py``).

    Only the services write it: a tenant's bridge asks a writer (``infra/claims.py``), as
    tenants once wrote their own keys (``$KV.WS_BRIDGES.<tenant>.>``) and JetStream answered
    their puts and gets on any reply subject they named. It still reads by direct get and
    refuses rollup headers (``Nats-Rollup: all`` on any key would purge every claim).
    Another service may create the bucket between our look and our create, and turn rollups
    off before our create arrives: JetStream then refuses ours (a different configuration),
    which is a success; the configuration is read and corrected all the same.

    Raises:
        nats.js.errors.APIError: JetStream refused the create or the update.
    """
    try:
        await js.key_value(BUCKET_BRIDGES)
    except BucketNotFoundError:
        wanted = KeyValueConfig(
            bucket=BUCKET_BRIDGES,
            description="Quill: local workspaces and the bridges that serve them",
            history=1,
            ttl=CLAIM_TTL_S * 4,
            max_value_size=MAX_CLAIM_BYTES,
            storage=StorageType.FILE,
            replicas=replicas,
            direct=True,
        )
        await assets.create_once(f"bucket {BUCKET_BRIDGES}", lambda: js.create_key_value(wanted))
    config = (await js.stream_info(STREAM_BRIDGES)).config
    if not config.allow_direct or config.allow_rollup_hdrs:
        update = dataclasses.replace(config, allow_direct=True, allow_rollup_hdrs=False)
        await js.update_stream(update)
    return tenant_bucket(js)


def tenant_bucket(js: JetStreamContext) -> KeyValue:
    """WS_BRIDGES without asking JetStream's API anything: puts go to
    ``$KV.WS_BRIDGES.<key>``, reads are direct gets."""
    return KeyValue(
        name=BUCKET_BRIDGES,
        stream=STREAM_BRIDGES,
        pre=f"$KV.{BUCKET_BRIDGES}.",
        js=js,
        direct=True,
    )


class Bridges:
    """The live claims, kept current by watching WS_BRIDGES."""

    def __init__(self, js: JetStreamContext) -> None:
        self._js = js
        self._claims: dict[str, Claim] = {}
        self._swept = time.monotonic()
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()

    def __len__(self) -> int:
        """Live claims (services report it in their ping, so that a bridge or a test can tell
        when every service has seen a claim)."""
        return sum(1 for claim in self._claims.values() if claim.live)

    def claims(self, tenant: str, workspace: str) -> Claim | None:
        """The live claim on ``tenant/workspace``, if a bridge answers for it."""
        claim = self._claims.get(key(tenant, workspace))
        return claim if claim is not None and claim.live else None

    def of_tenant(self, tenant: str) -> dict[str, Claim]:
        """``tenant``'s live claims, by workspace (what its quota counts: ``infra/claims.py``)."""
        prefix = f"{tenant}."
        return {
            name[len(prefix) :]: claim
            for name, claim in self._claims.items()
            if name.startswith(prefix) and claim.live
        }

    def note(self, tenant: str, workspace: str, claim: Claim | None) -> None:
        """What this service just stored (or deleted, None), before its watch says so: the
        next claim it handles counts it."""
        if claim is None:
            self._claims.pop(key(tenant, workspace), None)
        else:
            self._claims[key(tenant, workspace)] = claim

    def find(self, tenant: str, client: str, path: str) -> str | None:
        """The workspace of ``tenant`` whose live claim serves ``<client>:<path>`` (another
        tenant's bridge is not found: nothing about it leaks)."""
        for name, claim in self._claims.items():
            owner, _, workspace = name.partition(".")
            if owner == tenant and claim.live and (claim.client, claim.path) == (client, path):
                return workspace
        return None

    def _sweep(self) -> None:
        """Forget the claims that lapsed (a bridge that died without releasing its claim:
        the bucket's TTL removes it without telling watchers), at most once per
        ``SWEEP_S``: the claims held are those renewed lately, not every one ever seen."""
        now = time.monotonic()
        if now - self._swept < SWEEP_S:
            return
        self._swept = now
        for name in [n for n, claim in self._claims.items() if not claim.live]:
            del self._claims[name]

    async def start(self) -> None:
        kv = await bucket(self._js)
        self._task = asyncio.create_task(self._watch(kv))
        await asyncio.wait_for(self._ready.wait(), 10)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _watch(self, kv: KeyValue) -> None:
        while True:
            try:
                watcher = await kv.watchall()
                async for entry in watcher:
                    if entry is None:  # the initial values are in
                        self._ready.set()
                        continue
                    if entry.operation in ("DEL", "PURGE") or not entry.value:
                        self._claims.pop(entry.key, None)
                        continue
                    try:
                        self._claims[entry.key] = _decode(entry.value)
                    except msgspec.DecodeError:
                        log.warning("ignoring an unreadable claim on %s", entry.key)
                    self._sweep()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a connection blip: watch again
                log.warning("watching %s failed (%s); watching again", BUCKET_BRIDGES, exc)
                await asyncio.sleep(1)


async def claim(
    kv: KeyValue, tenant: str, workspace: str, owner: str, client: str, path: str
) -> int:
    """Claim ``tenant/workspace`` for a bridge, or renew its claim (the same ``owner``);
    returns the revision stored.

    Raises:
        QuillError: ``ALREADY_EXISTS`` if another live bridge holds it.
    """
    name = key(tenant, workspace)
    value = _encode(Claim(owner=owner, client=client, path=path, expires=_expiry()))
    try:
        current = await kv.get(name)
    except (NotFoundError, KeyError):
        current = None
    if current is not None and current.value:
        held = _decode(current.value)
        if held.live and held.owner != owner:
            raise QuillError(
                ErrorCode.ALREADY_EXISTS,
                f"{tenant}/{workspace} is served by another bridge ({held.client}:{held.path})",
                {"client": held.client, "path": held.path},
            )
        return int(await kv.update(name, value, last=current.revision))
    try:
        return int(await kv.create(name, value))
    except KeyWrongLastSequenceError:
        raise QuillError(
            ErrorCode.ALREADY_EXISTS, f"{tenant}/{workspace} was claimed at the same time"
        ) from None


async def renew(
    kv: KeyValue, tenant: str, workspace: str, owner: str, client: str, path: str, last: int
) -> int:
    """Extend a claim (only ours: a lapsed claim someone else took is not taken back)."""
    value = _encode(Claim(owner=owner, client=client, path=path, expires=_expiry()))
    return int(await kv.update(key(tenant, workspace), value, last=last))


async def release(kv: KeyValue, tenant: str, workspace: str) -> None:
    with contextlib.suppress(Exception):
        await kv.delete(key(tenant, workspace))


def _expiry() -> float:
    return time.time() + CLAIM_TTL_S
