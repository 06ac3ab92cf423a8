"""Contents in WS_BLOBS belong to one workspace (``<tenant>/<workspace>/<sha256>``): an
``apply`` that names a content by sha256 (``blob``) resolves it in the caller's own
namespace only, so a tenant can neither copy another tenant's content nor learn that some
workspace holds a content it guesses. Objects named by the bare sha256 (an earlier version's)
still read, and resolve no ``blob``."""

from __future__ import annotations

import os

import pytest

from contracts import hashing
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from infra.blobs import Blobs, object_info, remove
from quill.client import Quill
from tests.conftest import StartReader
from tests.helpers import new_workspace

BIG = os.urandom(90_000)
"""Over ``INLINE_MAX``: the writer stores it in WS_BLOBS."""


async def refused(call: object) -> QuillError:
    with pytest.raises(QuillError) as info:
        await call  # type: ignore[misc]
    return info.value


async def test_another_tenants_blob_cannot_be_named_by_its_sha(
    services: StartReader, quill: Quill
) -> None:
    await services("r1")
    sha = hashing.content_sha256(BIG)
    a, b = quill.workspace("tenant-a/vault"), quill.workspace("tenant-b/probe")
    for ws in (a, b):
        await ws.create()
    await a.write("key.bin", BIG)  # in WS_BLOBS, the writer's cache and its projection
    assert await a.read_bytes("key.bin") == BIG

    taken = await refused(b.apply([rq.PutChange(path="stolen.bin", blob=sha)]))
    unknown = await refused(b.apply([rq.PutChange(path="x.bin", blob="0" * 64)]))
    assert taken.code == unknown.code == ErrorCode.INVALID_ARGUMENT
    # nothing tells a content another tenant holds from one nobody holds
    assert taken.message.replace(sha, "0" * 64) == unknown.message
    assert (await b.list()).entries == []

    # b writes the same bytes itself: its own object (no upload skipped for a's), which it
    # may then name
    await b.write("own.bin", BIG)
    js = quill.nc.jetstream()
    assert await object_info(js, f"tenant-b/probe/{sha}") is not None
    await b.apply([rq.PutChange(path="again.bin", blob=sha)])
    assert await b.read_bytes("again.bin") == BIG
    # and a workspace of the same tenant is no different from another tenant's
    sibling = quill.workspace("tenant-a/sibling")
    await sibling.create()
    assert (await refused(sibling.apply([rq.PutChange(path="k", blob=sha)]))).code == (
        ErrorCode.INVALID_ARGUMENT
    )


async def test_a_legacy_object_still_reads_but_names_no_blob(
    services: StartReader, quill: Quill
) -> None:
    """A workspace written before namespaces: its event names a content stored under the
    bare sha256. A replica built from the log reads it; an ``apply`` cannot name it."""
    ws = await new_workspace(services, quill, "legacy/old")
    await ws.write("big.bin", BIG)
    sha = hashing.content_sha256(BIG)
    js = quill.nc.jetstream()
    own = Blobs(js).of("legacy", "old")
    # as an earlier version stored it: under the bare sha256, nothing under the prefix
    await (await js.object_store("WS_BLOBS")).put(sha, BIG)
    assert await remove(js, own.name(sha))
    assert not await own.has(sha) and await object_info(js, sha) is not None

    assert await Blobs(js).of("legacy", "old").get(sha) == BIG
    late = await services("r2")  # a replica with an empty projection fetches it
    assert await late.queries.blobs.of("legacy", "old").get(sha) == BIG
    error = await refused(ws.apply([rq.PutChange(path="copy.bin", blob=sha)]))
    assert error.code == ErrorCode.INVALID_ARGUMENT


@pytest.mark.parametrize(
    ("tenant", "workspace"), [("a/b", "c"), ("a", "../b"), ("", "w"), ("A", "w"), ("a", "w.x")]
)
def test_a_namespace_is_made_of_valid_ids_only(tenant: str, workspace: str) -> None:
    """An id that could reach into another prefix (``/``) or break a subject (``.``) is
    refused before any object is named."""
    with pytest.raises(QuillError) as info:
        Blobs(None).of(tenant, workspace)  # type: ignore[arg-type]
    assert info.value.code == ErrorCode.INVALID_ARGUMENT
