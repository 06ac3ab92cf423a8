"""The embedded NATS server runs under a Go memory limit (``GOMEMLIMIT``): 400 MiB unless
``quill up --nats-memory`` or the launcher's own ``GOMEMLIMIT`` says otherwise (issue 29: its
peak was 446 MiB without one at 1,000,000 events, 388 MiB with it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from quill_cli.natsserver import NatsServer
from tests.system.test_supervisor import stack_pids
from tests.up import Up


def limit_of(pid: int) -> str | None:
    """The ``GOMEMLIMIT`` process ``pid`` was started with (None: none)."""
    for entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
        if entry.startswith(b"GOMEMLIMIT="):
            return entry.split(b"=", 1)[1].decode()
    return None


def test_quill_up_sets_the_limit_it_is_given(tmp_path: Path) -> None:
    up = Up(tmp_path / "q", args=("--nats-memory", "300MiB")).start()
    try:
        assert limit_of(stack_pids(up)["nats"]) == "300MiB"
    finally:
        up.stop()


@pytest.mark.parametrize(
    ("ours", "limit", "expected"),
    [(None, None, "400MiB"), (None, 0, None), ("1GiB", None, "1GiB"), (None, 2 << 30, "2048MiB")],
)
def test_the_default_and_what_wins(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    ours: str | None,
    limit: int | None,
    expected: str | None,
) -> None:
    monkeypatch.delenv("GOMEMLIMIT", raising=False)
    if ours is not None:
        monkeypatch.setenv("GOMEMLIMIT", ours)
    server = NatsServer(
        tmp_path / "nats", watch=False, **({} if limit is None else {"memory_limit": limit})
    )
    server.start()
    try:
        assert server.process is not None
        assert limit_of(server.process.pid) == expected
    finally:
        server.stop()
