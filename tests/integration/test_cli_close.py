"""The CLI gives up closing its connection after ``CLOSE_S`` (``quill_cli/client.py``): Ctrl-C
ends a command even when the close would never finish."""

from __future__ import annotations

import asyncio

import pytest

from quill_cli import client as cli_client

DEADLINE_S = 20.0
"""A guard against the old behaviour (waiting forever), not a measurement."""


async def test_a_close_that_never_ends_is_given_up(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli_client, "CLOSE_S", 0.1, raising=False)
    quill = await cli_client.connect(nats_url, "--nats-url")
    nc = quill.nc
    close = nc.close
    never = asyncio.Event()

    async def hangs() -> None:  # as nats-py's close stuck on a socket that is never drained
        await never.wait()

    monkeypatch.setattr(nc, "close", hangs)
    try:
        async with asyncio.timeout(DEADLINE_S):
            await quill.close()
    finally:
        await close()
    assert nc.is_closed


async def test_a_close_that_ends_is_waited_for(nats_url: str) -> None:
    quill = await cli_client.connect(nats_url, "--nats-url")
    await quill.close()
    assert quill.nc.is_closed
