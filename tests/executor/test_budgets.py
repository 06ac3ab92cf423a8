"""Issue 17, bounded memory: what an executor keeps per workspace (checkouts in memory and on
disk, their locks) stays within its budget however many workspaces run commands, and a
command for a workspace that does not exist leaves nothing behind."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS

from contracts.errors import ErrorCode, QuillError
from quill.client import Quill
from services.executor.app import Executor, ExecutorConfig
from tests.helpers import start_executor, start_writer_and_reader


@pytest_asyncio.fixture
async def executor(nats_url: str, tmp_path: Path) -> AsyncIterator[Executor]:
    async with AsyncExitStack() as es:
        await start_writer_and_reader(es, nats_url, tmp_path)
        config = ExecutorConfig(sandbox="local")
        yield await start_executor(es, nats_url, tmp_path / "executor", config)


def on_disk(executor: Executor) -> set[str]:
    tenant = executor.settings.data_dir / "checkouts" / "acme"
    return {p.name for p in tenant.iterdir()} if tenant.exists() else set()


async def test_checkouts_in_memory_and_on_disk_stay_within_their_budgets(
    executor: Executor, nc: NATS
) -> None:
    checkouts = executor.checkouts
    checkouts.in_memory, checkouts.budget.most = 2, 3
    quill = Quill(nc)
    names = [f"held-{i}" for i in range(6)]
    for name in names:
        ws = quill.workspace(f"acme/{name}")
        await ws.create()
        await ws.exec(f"mkdir -p node_modules && echo {name} > node_modules/kept")
        assert len(checkouts.live) <= 2 and len(checkouts.budget.sizes) <= 3
        assert len(checkouts.locks) == 0  # no lock outlives its holders
    assert on_disk(executor) == set(names[3:])
    assert set(checkouts.live) == {("acme", n) for n in names[4:]}
    # forgotten in memory, still on disk: opened again as it was left (its ignored cache too)
    again = await quill.workspace(f"acme/{names[3]}").exec("cat node_modules/kept")
    assert again.stdout == f"{names[3]}\n"
    assert len(checkouts.live) <= 2 and on_disk(executor) == set(names[3:])


async def test_a_command_for_a_missing_workspace_leaves_no_checkout(
    executor: Executor, nc: NATS
) -> None:
    quill = Quill(nc, retries=0)
    for i in range(3):
        with pytest.raises(QuillError) as info:
            await quill.workspace(f"acme/never-{i}").exec("true")
        assert info.value.code == ErrorCode.WORKSPACE_NOT_FOUND
    assert on_disk(executor) == set()
    assert not executor.checkouts.live and len(executor.checkouts.locks) == 0
