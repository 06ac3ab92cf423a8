"""How an executor runs (``quill executor`` options)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from infra.exec.egress import Policy
from services.executor.output import OutputConfig


@dataclass(frozen=True)
class ExecutorConfig:
    sandbox: str | None = None
    """``bwrap``, ``local`` or None (bwrap when it works here, else local)."""
    max_runs: int = 4
    """Requests answered at once (see ``slots`` for how tenants share them)."""
    tenant_runs: int | None = None
    """Most slots one tenant may hold (None: ``max_runs - 1``, at least 1)."""
    tenant_live: int = 8
    """Commands one tenant may have running on past their answer (``yield_ms``) on this
    executor (each holds its slot as well); more are refused (``SIZE_LIMIT_EXCEEDED``)."""
    queue: int = 16
    """Requests waiting for a slot, per tenant; more are refused with UNAVAILABLE."""
    queue_wait_s: float = 120.0
    """Longest a request waits for a slot before UNAVAILABLE."""
    checkouts_budget: int = 16 * 1024**3
    """Bytes all checkouts may hold on disk, running commands' included; past it, idle ones
    are evicted (least recently used), and a command growing its checkout past what the
    others leave is stopped."""
    max_checkout_bytes: int | None = None
    """The most one checkout may hold, whatever its workspace's ``max_checkout_bytes`` says
    (None: ``checkouts_budget``)."""
    disk_reserve: int | None = None
    """Free bytes the data disk keeps: below, new commands are refused (None: max(1 GiB, 5%))."""
    memory_bytes: int = 4 * 1024**3
    processes: int = 512
    file_bytes: int = 1024**3
    credentials: Path | None = None
    """TOML file of git credentials (see ``infra/exec/git/``)."""
    git_allow: tuple[str, ...] = ()
    """More git allow-list entries, ``HOST[:PORT]`` (``infra/exec/git/targets.py``)."""
    egress_allow: tuple[str, ...] = ()
    """Hosts a tenant's or workspace's commands may reach through the egress proxy,
    ``TENANT[/WORKSPACE]=HOST,...`` (``infra/exec/egress/rules.py``); none: no network."""
    egress_policy: Policy | None = None
    """How the egress proxy resolves and connects (its limits; tests give a resolver and a
    dial of their own); None: the defaults."""
    overlay: bool = True
    """bwrap: run each command over an overlay of its checkout where one can be mounted
    (``infra.exec.sandbox.overlay``); False: over the checkout itself, walked afterwards."""
    output: OutputConfig = OutputConfig()
    """How long and how much of commands' output is kept for ``exec.output`` (``output``)."""
