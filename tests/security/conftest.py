"""The adversarial suite: each attack of issue 10 as a test through the real path (real bwrap
sandboxes, ``quill up`` as a process, bare nats-py clients with each tenant's credentials, MCP
and REST clients).

Shared here: host canary files that every attack test checks afterwards (``canaries``),
``verify`` (``quill verify`` on a workspace must pass after an attack), and ``provider``
(bwrap, whose commands run over an overlay, and local, whose checkout is walked: what the
executor does on the host after a command holds with both)."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from quill.client import Quill
from quill_cli.natsserver import NatsServer
from tests.gateway.conftest import start  # noqa: F401 (a fixture: gateways on a writer, a reader)
from tests.up import Up


class Canaries:
    """Host files an attacker would like to change or read: their hashes are checked after."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.files = {name: root / name for name in ("host-file", "passwd", "secret.key")}
        for name, path in self.files.items():
            path.write_text(f"canary {name}: must never change\n")
        self._before = self.snapshot()

    def snapshot(self) -> dict[str, str]:
        seen = {}
        for path in sorted(self.root.rglob("*")):
            if path.is_symlink() or not path.is_file():
                seen[str(path.relative_to(self.root))] = "non-file"
            else:
                seen[str(path.relative_to(self.root))] = hashlib.sha256(
                    path.read_bytes()
                ).hexdigest()
        return seen

    def assert_unchanged(self) -> None:
        assert self.snapshot() == self._before, "a host canary file changed or appeared"


@pytest.fixture(scope="module", params=["bwrap", "local"])
def provider(request: pytest.FixtureRequest) -> str:
    """The sandbox provider of an executor-side test (bwrap skipped where it cannot run); a
    module's tests run with one, then the other (``per_provider`` gives each its server)."""
    from infra.exec.sandbox import probe_bwrap

    if request.param == "bwrap" and (why := probe_bwrap()) is not None:
        print(f"skipped: bwrap cannot run here: {why}")
        pytest.skip(f"bwrap cannot run here: {why}")
    return str(request.param)


@pytest.fixture(scope="module")
def per_provider(tmp_path_factory: pytest.TempPathFactory, provider: str) -> Iterator[NatsServer]:
    """A nats-server of each provider's own (the tests name their workspaces): a module's
    ``nats_server`` where it imports this as that (``from tests.security.conftest import
    per_provider as nats_server``)."""
    server = NatsServer(tmp_path_factory.mktemp(f"nats-{provider}")).start()
    yield server
    server.stop()


@pytest_asyncio.fixture
async def client(nats_url: str) -> AsyncIterator[Quill]:
    """A client that does not retry: a refusal shows as it is."""
    quill = await Quill.connect(nats_url, retries=0)
    yield quill
    await quill.close()


def bwrap_only(provider: str, why: str) -> None:
    """Skip a test of what only the bwrap sandbox gives, saying so, under ``local``."""
    if provider != "bwrap":
        print(f"skipped under {provider}: {why}")
        pytest.skip(f"{provider}: {why}")


@pytest.fixture
def canaries(tmp_path: Path) -> Iterator[Canaries]:
    """Host files outside every checkout; unchanged after the test, or it fails."""
    found = Canaries(tmp_path / "host")
    yield found
    found.assert_unchanged()


def verify(up: Up, workspace: str) -> None:
    """``quill verify`` passes on ``workspace`` (its log checks out and the replicas agree)."""
    result = up.cli("verify", workspace, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
