"""Each MCP session's own shell (issue 32, item 2), as a model drives it with the official MCP
client over real HTTP (a real gateway, writer, reader and executor): ``cd`` and ``export``
carry over from one ``execute_command`` to the next; two sessions do not share a directory;
the session's end closes its shell (``exec.list`` no longer shows it); a lost shell is replaced
and the answer says so once; ``workdir`` and clients without a session run on their own."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import pytest_asyncio
from mcp.types import Implementation

from quill.client import Quill
from services.executor.app import ExecutorConfig
from services.gateway.mcp.terminal import NEW_SHELL
from services.gateway.server import Gateway
from tests.gateway.support import mcp_client, ok
from tests.helpers import eventually, start_executor


@pytest_asyncio.fixture
async def executor(gateway: Gateway, nats_url: str, tmp_path: Path) -> AsyncIterator[None]:
    async with AsyncExitStack() as stack:
        await start_executor(stack, nats_url, tmp_path / "executor", ExecutorConfig())
        yield


AGENT = Implementation(name="agent", version="1.0")


def session(gateway: Gateway):  # type: ignore[no-untyped-def]
    """An MCP session of a handshake-era client (it keeps an ``Mcp-Session-Id``)."""
    return mcp_client(gateway.url, client_info=AGENT, mode="legacy")


def cwd(said: str) -> str:
    """The directory ``pwd`` printed (its answer's last line)."""
    return said.rstrip().splitlines()[-1]


async def shells(sdk: Quill) -> list[str]:
    return [s.shell for s in (await sdk.workspace("default/default").running()).shells]


async def test_cd_and_export_carry_over_in_a_session(
    gateway: Gateway, executor: None, sdk: Quill
) -> None:
    async with session(gateway) as mcp:
        await ok(mcp, "execute_command", command="mkdir -p sub && cd sub")
        assert "/workspace/sub" in await ok(mcp, "execute_command", command="pwd")
        await ok(mcp, "execute_command", command="export X=1")
        said = await ok(mcp, "bash", command='echo "X is $X"')  # the alias: the same shell
        assert "X is 1" in said
        assert NEW_SHELL not in said
        assert len(await shells(sdk)) == 1
        # workdir asks for a command of its own: a fresh sandbox, the shell's cwd untouched
        assert cwd(await ok(mcp, "execute_command", command="pwd", workdir=".")) == "/workspace"
        assert "/workspace/sub" in await ok(mcp, "execute_command", command="pwd")


async def test_two_sessions_do_not_share_a_directory(
    gateway: Gateway, executor: None, sdk: Quill
) -> None:
    async with session(gateway) as one, session(gateway) as two:
        await ok(one, "execute_command", command="mkdir -p a && cd a")
        await ok(two, "execute_command", command="mkdir -p b && cd b")
        assert "/workspace/a" in await ok(one, "execute_command", command="pwd")
        assert "/workspace/b" in await ok(two, "execute_command", command="pwd")
        assert len(await shells(sdk)) == 2


async def test_the_end_of_a_session_closes_its_shell(
    gateway: Gateway, executor: None, sdk: Quill
) -> None:
    async with session(gateway) as mcp:
        await ok(mcp, "execute_command", command="sleep 600 &")
        opened = await shells(sdk)
        assert len(opened) == 1
    # the client's DELETE of its session closed it before the exit returned
    assert opened[0] not in await shells(sdk)


async def test_a_lost_shell_is_replaced_and_said_once(
    gateway: Gateway, executor: None, sdk: Quill
) -> None:
    async with session(gateway) as mcp:
        await ok(mcp, "execute_command", command="mkdir -p sub && cd sub")
        [lost] = await shells(sdk)
        await sdk.workspace("default/default").shell_of(lost).close()  # as an idle timeout
        said = await ok(mcp, "execute_command", command="pwd")
        assert said.startswith(NEW_SHELL)
        assert cwd(said) == "/workspace"  # reset
        again = await ok(mcp, "execute_command", command="pwd")
        assert NEW_SHELL not in again
        assert lost not in await eventually(lambda: shells(sdk))


async def test_a_client_without_a_session_runs_each_command_on_its_own(
    gateway: Gateway, executor: None, sdk: Quill
) -> None:
    async with mcp_client(gateway.url, client_info=AGENT, mode="auto") as mcp:
        await ok(mcp, "execute_command", command="mkdir -p sub && cd sub")
        assert cwd(await ok(mcp, "execute_command", command="pwd")) == "/workspace"
        assert await shells(sdk) == []
