"""The shortcuts a command's path takes, held to what they replace: the bwrap shim hands
``bash -c`` its environment itself (no ``env -i`` exec) only where that is exactly the same
environment; a local command's processes are found gone in one scan of /proc only where that
scan proves it; a sandbox's empty cgroup is removed after the reply, never one still holding
a process. Real bwrap sandboxes and processes."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest

from infra.exec import sandbox
from infra.exec.sandbox import BwrapProvider, Limits, LocalProvider, Spawn, common

WHY_NO_BWRAP = sandbox.probe_bwrap()
needs_bwrap = pytest.mark.skipif(WHY_NO_BWRAP is not None, reason=f"bwrap: {WHY_NO_BWRAP}")
LIMITS = Limits(cpu_s=20, memory_bytes=512 * 1024**2, processes=64)

ENVS = [
    {},
    {"FOO": "a b\nc=d e", "HOME": "/workspace", "EMPTY": ""},
    {"a": "1", "k": "2", "n": "3", "count": "4", "status": "5"},  # the shim's own names
    {"SHLVL": "7", "PWD": "/", "OLDPWD": "/tmp", "_": "x", "POSIXLY_CORRECT": "1"},
    {"IFS": "x", "BASH_ENV": "/nonexistent", "BASHOPTS": "x", "PPID": "1", "RANDOM": "4"},
    {"LC_ALL": "xx_YY.UTF-8", "LANG": "de_DE.UTF-8"},  # a locale bash lacks: no warning
    {"x-y": "1", "1X": "2", "a.b": "3"},  # names bash cannot export
    {"PATH": "/workspace/bin:/usr/bin:/bin"},
]


def environ(data: bytes) -> list[str]:
    return sorted(item.decode() for item in data.split(b"\0") if item)


def expected(env: dict[str, str]) -> list[str]:
    shims = common.SHIMS if common.shim_links() else None
    return sorted(f"{k}={v}" for k, v in common.environment("/tmp", env, shims).items())


@needs_bwrap
@pytest.mark.parametrize("env", ENVS, ids=range(len(ENVS)))
async def test_bash_gets_exactly_its_environment(tmp_path: Path, env: dict[str, str]) -> None:
    provider = BwrapProvider()
    try:
        for spare in (False, True):
            if spare:
                provider.warm(tmp_path, LIMITS)
                assert await provider.warmed(tmp_path) == 1
            spawn = Spawn(
                ["bash", "-c", 'cat /proc/$$/environ; echo "$SHLVL" >&2'],
                env=env,
                watch_stdin=True,
                count_left=True,
            )
            o = await provider.run(tmp_path, spawn, LIMITS)
            assert o.exit_code == 0, o.stderr
            assert environ(o.stdout) == expected(env)  # what bash was given, and nothing else
            shlvl = int(env.get("SHLVL", "0")) + 1
            assert o.stderr.endswith(f"{shlvl}\n".encode())  # SHLVL as under env -i
            assert o.stderr.count(b"warning") == (1 if "LANG" in env else 0), o.stderr  # bash's
            assert provider.used == int(spare)
    finally:
        await provider.close()


@needs_bwrap
async def test_a_program_bash_cannot_find_is_reported_as_before(tmp_path: Path) -> None:
    provider = BwrapProvider()
    try:
        spawn = Spawn(["no-such-program-here"], watch_stdin=True, count_left=True)
        o = await provider.run(tmp_path, spawn, LIMITS)
        assert o.exit_code == 127 and o.stderr.startswith(b"/usr/bin/env: "), o.stderr
    finally:
        await provider.close()


@needs_bwrap
async def test_cgroups_are_removed_after_the_reply_only_when_empty(tmp_path: Path) -> None:
    provider = BwrapProvider()
    if not provider.cgroups:
        pytest.skip(provider.no_cgroups)
    later: common.Later = []
    with common.after_reply(later):
        o = await provider.run(tmp_path, Spawn(["bash", "-c", "sleep 100 & echo ok"]), LIMITS)
    assert o.stdout == b"ok\n"
    assert len(later) == 1  # nothing was left in it: its removal waits for the reply
    for tidy in later:
        await tidy()
    base = f"{sandbox.cgroups.PREFIX}{sandbox.cgroups.owner(os.getpid())}-*"
    assert not [p for path in provider._cgroups.bases for p in path.glob(base)]  # type: ignore[union-attr]


async def test_a_local_command_exec_looping_is_gone_when_run_returns(tmp_path: Path) -> None:
    t = f"1000.{secrets.randbelow(10**9):09d}"
    script = (
        f"bash -c 'while :; do /bin/true; done' {t} & "  # in execve all the time
        f"(setsid bash -c 'while :; do sleep 0.001; done' {t} &) ; "
        f"for i in 1 2 3; do sleep {t} & done; sleep 0.05; echo ok"
    )
    for _ in range(5):
        later: common.Later = []
        with common.after_reply(later):
            spawn = Spawn(["bash", "-c", script], count_left=True)
            o = await LocalProvider().run(tmp_path, spawn, Limits())
        assert o.stdout == b"ok\n" and o.left_running >= 5, o
        assert survivors(t) == []  # at once: before any reply
        for tidy in later:
            await tidy()


def survivors(needle: str) -> list[int]:
    found = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if needle.encode() in f.read():
                    with open(f"/proc/{name}/stat", "rb") as s:
                        if s.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X"):
                            found.append(int(name))
        except OSError:
            pass
    return found
