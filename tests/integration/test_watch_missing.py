"""``watch`` of a workspace that does not exist fails like every other call on it (SDK and
``quill watch``, exit 3); with ``wait`` it waits, and the creation is the first notification."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest
from nats.aio.client import Client as NATS

from contracts.errors import ErrorCode, QuillError
from contracts.subjects import Subjects
from quill.client import Quill
from tests.helpers import subscribed
from tests.integration.conftest import StartReader

DEADLINE_S = 20.0
"""A guard against the old behaviour (waiting forever), not a measurement."""


async def test_watch_of_a_missing_workspace_fails(services: StartReader, quill: Quill) -> None:
    await services("r1")
    updates = quill.workspace("acme/nowhere").watch()
    with pytest.raises(QuillError) as info:
        await asyncio.wait_for(anext(updates), DEADLINE_S)
    assert info.value.code == ErrorCode.WORKSPACE_NOT_FOUND
    assert info.value.message == "Workspace not found: acme/nowhere"


async def test_watch_with_wait_sees_the_creation_first(
    services: StartReader, quill: Quill, nc: NATS
) -> None:
    await services("r1")
    subject = Subjects().updated("acme", "later")
    updates = quill.workspace("acme/later").watch(wait=True)
    first = asyncio.create_task(anext(updates))
    await subscribed(quill.nc, subject, DEADLINE_S)
    assert not first.done()  # waiting, not failed
    await quill.workspace("acme/later").create()
    update = await asyncio.wait_for(first, DEADLINE_S)
    assert (update.workspace, update.version, update.op) == ("later", 1, "create")
    await updates.aclose()


async def test_quill_watch_of_a_missing_workspace_exits_3(
    services: StartReader, nats_url: str
) -> None:
    await services("r1")
    env = {**os.environ, "QUILL_NATS_URL": nats_url}
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "quill", "watch", "acme/nowhere"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert (done.returncode, done.stderr) == (
        3,
        "quill: WORKSPACE_NOT_FOUND: Workspace not found: acme/nowhere\n",
    )
