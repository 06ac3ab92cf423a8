"""Issue 32, item 5: with egress allowed, ``pip install`` in a command works through the
executor's proxy (a PEP 503 index of one tiny wheel, served by the test as a "public" host:
``tests.egress_targets``), and the virtualenv it fills, ``.gitignore``d, is not committed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from quill.client import Quill
from tests.egress_targets import Target, policy, target
from tests.executor.conftest import StartExecutor


@pytest.fixture(scope="module")
def server() -> Iterator[Target]:
    with target() as state:
        yield state


PIP = (
    "python3 -m venv --system-site-packages .venv && "
    "PIP_DISABLE_PIP_VERSION_CHECK=1 .venv/bin/python -m pip install -q --no-cache-dir "
    "--index-url http://pkgs.example.com/simple/ --trusted-host pkgs.example.com tinypkg && "
    ".venv/bin/python -c 'import tinypkg; print(tinypkg.HELLO)'"
)


async def test_pip_install(stack: StartExecutor, quill: Quill, name: str, server: Target) -> None:
    """Through the proxy; the .gitignored virtualenv is not committed (a short name: the
    proxy's socket lives under the test's data directory, within a socket path's 108 bytes)."""
    tenant, workspace = name.split("/")
    await stack(
        egress_allow=(f"{tenant}/{workspace}=pkgs.example.com",), egress_policy=policy(server)
    )
    ws = quill.workspace(name)
    await ws.create()
    await ws.write(".gitignore", ".venv/\n")
    result = await ws.exec(PIP, timeout_ms=120_000)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == "hello from tinypkg"
    assert result.changes.total == 0  # the virtualenv is ignored: nothing committed
    assert any(s.endswith("tinypkg-1.0-py3-none-any.whl") for s in server.seen)
