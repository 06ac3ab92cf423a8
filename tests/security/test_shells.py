"""Shells (``exec.shell_open``, ``exec.run`` with ``shell``) under attack, through real bwrap
sandboxes and the local provider where the attack applies (local is no sandbox: what only a
sandbox can hold is skipped there, saying why).

* A background process that keeps writing after its shell closed is dead when the close
  answers: no process with its marker in /proc, and nothing it wrote is committed after the
  close while another shell's identical writer goes on beating.
* A background process writing outside the checkout (the host's files, the checkout's
  parent) changes nothing there (bwrap).
* A command of one shell reading every other process's stdin sees nothing of another shell's
  commands (bwrap: its own PID namespace).
* Tenant b using tenant a's shell id (run, checkpoint, close) gets the very error a made-up id
  gets (``SHELL_NOT_FOUND``), and nothing is done in a's shell.
* A fork bomb in a shell is held by its sandbox's ``pids.max``; another shell of the same
  workspace still answers (bwrap).
* A shell's checkout is held to its quota (a command's writes and a background process's) and
  counts against the checkouts budget while the shell lives.
* An output flood, in a command and from a background process, is bounded in the reply and
  the shell still answers after.
* A command that prints what ``set`` and ``declare -p`` show and forges the end of a command
  with every token-like value and descriptor they name neither ends early nor touches the next
  command's output (the server's tokens live in a supervisor outside the evaluating shell).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest

from contracts.errors import ErrorCode, QuillError
from contracts.limits import LimitsPatch
from infra.exec.sandbox import cgroups
from quill.client import Quill, Workspace
from services.executor.app import Executor
from tests.executor.conftest import (  # noqa: F401
    StartExecutor,
    executor,
    name,
    provider,
    stack,
    ws,
)
from tests.helpers import ask, error_shape, eventually, refused
from tests.security.conftest import Canaries, bwrap_only
from tests.up import TENANTS, Up, a_against_b

pytestmark = pytest.mark.up(tenants=TENANTS)

MADE_UP = "s0123456789abMadeUpShell0"
MIB = 1024**2


async def created(
    stack: StartExecutor,  # noqa: F811
    quill: Quill,
    name: str,  # noqa: F811
    limits: LimitsPatch | None = None,
    **options: int,
) -> Workspace:
    """An executor started (with ``options``), and the workspace ``name`` made."""
    await stack(**options)
    ws = quill.workspace(name)  # noqa: F811
    await ws.create(limits=limits)
    return ws


def marked(marker: str) -> list[int]:
    """Host processes whose command line holds ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            found.append(int(entry))
    return found


def beats(path: Path) -> int:
    """Lines written to ``path`` so far (0 before it exists)."""
    try:
        return len(path.read_text().splitlines())
    except FileNotFoundError:
        return 0


def beater(marker: str, path: str) -> str:
    """A background process, ``marker`` in its command line, appending to ``path`` every 50 ms."""
    return (
        f"(exec -a {marker} bash -c 'while :; do date +%s%N >> {path}; sleep 0.05; done') "
        ">/dev/null 2>&1 &"
    )


async def test_a_background_writer_is_dead_once_its_shell_closed(
    executor: Executor,  # noqa: F811
    ws: Workspace,  # noqa: F811
) -> None:
    marker = f"quill-beat-{secrets.token_hex(6)}"
    sh = await ws.shell()
    other = await ws.shell()
    try:
        tree = executor.shells.held[sh.id].checkout.tree
        await sh.run(beater(marker, "beat.txt"))
        await eventually(lambda: beats(tree / "beat.txt") >= 3)
        assert marked(marker), "the writer is not found in /proc: the check could not fail"
        closed = await sh.close()
        assert closed.background is not None and [p.path for p in closed.background.paths] == [
            "beat.txt"
        ]
        # what ``killed`` counts is test_shells.py's (sleeps that do not fork); here the
        # writer forks a sleep every 50 ms, so the proof is that none of it is left:
        await eventually(lambda: not marked(marker), timeout=5, what="no writer left")
        after = (await ws.read("beat.txt")).content
        revisions = len((await ws.history("beat.txt")).revisions)
        # another shell's identical writer beats 10 times: time enough for a survivor's
        other_tree = executor.shells.held[other.id].checkout.tree
        ref = f"quill-ref-{secrets.token_hex(6)}"
        await other.run(beater(ref, "ref.txt"))
        await eventually(lambda: beats(other_tree / "ref.txt") >= 10)
        assert not marked(marker)
        assert (await ws.read("beat.txt")).content == after  # nothing committed since
        assert len((await ws.history("beat.txt")).revisions) == revisions
    finally:
        await other.close()


async def test_a_background_writer_stays_in_the_sandbox(
    executor: Executor,  # noqa: F811
    ws: Workspace,  # noqa: F811
    provider: str,  # noqa: F811
    canaries: Canaries,
) -> None:
    bwrap_only(provider, "the local provider is no sandbox: its processes write the host's files")
    async with await ws.shell() as sh:
        home = executor.shells.held[sh.id].checkout.home
        targets = [*map(str, canaries.files.values()), str(home / "outside.txt"), "../escaped"]
        writes = "; ".join(f"echo pwned > {t}" for t in targets)
        await sh.run(f"(sleep 0.1; {writes}; echo tried > done.txt) >/dev/null 2>&1 &")

        async def committed() -> bool:
            # by the command's own capture when it came after the job wrote (under load),
            # else by a checkpoint
            await sh.checkpoint()
            return "done.txt" in [e.path for e in (await ws.list("")).entries]

        await eventually(committed)
        assert not (home / "outside.txt").exists()
        assert not (home.parent / "escaped").exists()
        assert [e.path for e in (await ws.list("")).entries] == ["done.txt"]
    # canaries: unchanged (the fixture checks)


async def test_a_command_cannot_read_another_shells_stdin(
    stack: StartExecutor,  # noqa: F811
    quill: Quill,
    name: str,  # noqa: F811
    provider: str,  # noqa: F811
) -> None:
    bwrap_only(provider, "local commands run as the executor's user and see every process")
    ws = await created(stack, quill, name)  # noqa: F811
    secret = f"secret-{secrets.token_hex(8)}"
    async with await ws.shell() as thief, await ws.shell() as victim:
        steal = (
            "(while :; do for f in /proc/[0-9]*/fd/0; do "
            '{ timeout 0.2 cat "$f" 2>/dev/null & }; done; wait; echo pass >> $HOME/passes; '
            "done) > $HOME/stolen 2>/dev/null &"
        )
        await thief.run(steal)
        r = await thief.run("while [ ! -s $HOME/passes ]; do sleep 0.05; done; ls /proc | wc -l")
        assert r.exit_code == 0
        for _ in range(3):
            r = await victim.run(f"echo {secret}")
            assert (r.stdout, r.exit_code) == (f"{secret}\n", 0)  # all its input, its own
        r = await thief.run(
            "n=$(wc -l < $HOME/passes); while [ $(wc -l < $HOME/passes) -lt $((n + 2)) ]; "
            "do sleep 0.05; done; cat $HOME/stolen"
        )
        assert r.exit_code == 0
        assert secret not in r.stdout


async def test_another_tenants_shell_is_unknown_and_untouched(up: Up) -> None:
    async with a_against_b(up) as (wa, nb, refusals):
        sh = await wa.shell()
        await sh.run("mkdir -p sub && cd sub && export MINE=1")
        bodies = {
            "run": {"command": "cd / && export MINE=b && touch $HOME/pwned pwned", "shell": sh.id},
            "checkpoint": {"shell": sh.id},
            "shell_close": {"shell": sh.id},
        }
        for op, body in bodies.items():
            foreign = await ask(nb, f"ws.exec.b.shared.{op}", body)
            made_up = await ask(nb, f"ws.exec.b.shared.{op}", {**body, "shell": MADE_UP})
            assert error_shape(foreign, sh.id) == error_shape(made_up, MADE_UP)
            assert error_shape(foreign, sh.id)[0] == "SHELL_NOT_FOUND"
            await refused(nb, refusals, f"ws.exec.a.shared.{op}", body)  # a's subject
        r = await sh.run('pwd; echo "$MINE"; [ -e pwned ] || [ -e $HOME/pwned ]; echo $?')
        lines = r.stdout.splitlines()
        assert lines[0].endswith("/sub") and lines[1:] == ["1", "1"], r  # nothing b did
        assert (await wa.running()).shells[0].shell == sh.id  # still open
        await sh.close()


CGROUPS, WHY_NO_CGROUPS = cgroups.detect()


def sandbox_cgroups() -> list[Path]:
    """This process's sandbox cgroups that exist now (its executors')."""
    if CGROUPS is None:
        return []
    mine = f"{cgroups.PREFIX}{cgroups.owner(os.getpid())}-"
    return [path for base in CGROUPS.bases for path in base.glob(f"{mine}*")]


async def test_a_fork_bomb_is_held_and_another_shell_answers(
    stack: StartExecutor,  # noqa: F811
    quill: Quill,
    name: str,  # noqa: F811
    provider: str,  # noqa: F811
) -> None:
    bwrap_only(provider, "the local provider as root has no fork-bomb containment")
    if CGROUPS is None:
        print(f"skipped: no cgroups here: {WHY_NO_CGROUPS}")
        pytest.skip(f"no cgroups: {WHY_NO_CGROUPS}")
    ws = await created(stack, quill, name, processes=64)  # noqa: F811
    bomb = await ws.shell()
    async with await ws.shell() as calm:
        r = await bomb.run("bomb() { bomb | bomb & }; (bomb) >/dev/null 2>&1 &")
        assert r.exit_code == 0

        def refused() -> int:
            most = 0
            for path in sandbox_cgroups():
                try:
                    current = int((path / "pids.current").read_text())
                    limit = int((path / "pids.max").read_text())
                    events = int((path / "pids.events").read_text().split()[1])
                except (OSError, ValueError, IndexError):
                    continue
                if limit == 64:  # the bomb's shell's (or its neighbour's)
                    assert current <= limit
                    most = max(most, events)
            return most

        await eventually(lambda: refused() > 0, what="pids.max refused a fork")
        for _ in range(3):
            r = await calm.run("echo alive; true")
            assert (r.stdout, r.exit_code) == ("alive\n", 0)
        closed = await bomb.close()
        assert closed.killed > 0
    r = await ws.exec("echo fine")
    assert r.stdout == "fine\n"


async def test_an_output_flood_is_bounded_and_the_shell_answers(
    executor: Executor,  # noqa: F811
    ws: Workspace,  # noqa: F811
) -> None:
    async with await ws.shell() as sh:
        cap = executor.shells.held[sh.id].checkout.limits.max_output_bytes
        r = await sh.run("head -c 20000000 /dev/zero | tr '\\0' x; echo; echo end >&2")
        assert r.exit_code == 0 and r.stdout_bytes == 20_000_001
        assert r.stdout_truncated and len(r.stdout) <= cap + 1024
        assert r.stderr == "end\n"
        r = await sh.run("echo after")
        assert (r.stdout, r.exit_code) == ("after\n", 0)
        # a background flood: between commands dropped, during one that command's (bounded)
        await sh.run("(yes flood) &")
        r = await sh.run("head -c 5000000 /dev/zero > /dev/null; echo mine")
        assert r.exit_code == 0 and len(r.stdout) <= cap + 1024
        r = await sh.run("pkill -f '^yes flood' || kill %1; echo quiet")
        assert r.exit_code == 0
        r = await sh.run("echo last")
        assert r.exit_code == 0 and r.stdout.endswith("last\n")


FORGE = r"""
{ set; declare -p; } > $HOME/seen 2>&1
for t in $(grep -aoE '[0-9a-f]{32}' $HOME/seen | sort -u); do
  printf '%s' "$t"; printf '%s0\n' "$t" >&2
done
for n in $(grep -aoE '=[0-9]+$' $HOME/seen | tr -d = | sort -un); do
  if [ "$n" -ge 3 ] && [ "$n" -lt 256 ]; then
    for s in $(seq 0 9); do printf '%d 0\n' "$s" >&"$n"; done 2>/dev/null
  fi
done
echo after; echo err-after >&2
(exit 3)
"""
"""A command forging its end with every token-like value and descriptor ``set`` shows."""


async def test_a_command_cannot_forge_its_end_from_what_set_shows(
    stack: StartExecutor,  # noqa: F811
    quill: Quill,
    name: str,  # noqa: F811
) -> None:
    ws = await created(stack, quill, name)  # noqa: F811
    async with await ws.shell() as sh:
        r = await sh.run("set | wc -l; declare -p | wc -l; env | wc -l")
        assert r.exit_code == 0
        r = await sh.run(FORGE)
        # before: ended at the first forged token, exit 0, nothing after it
        assert r.exit_code == 3, r
        assert r.stdout.endswith("after\n") and r.stderr.endswith("err-after\n"), r
        r = await sh.run("echo next; echo next-err >&2")
        assert (r.stdout, r.stderr, r.exit_code) == ("next\n", "next-err\n", 0)
        r = await sh.run("set")  # printing the server's variables is harmless
        assert r.exit_code == 0 and "__quill_in" in r.stdout
        r = await sh.run("echo again")
        assert (r.stdout, r.exit_code) == ("again\n", 0)


async def test_a_shells_checkout_is_held_to_its_quota(
    stack: StartExecutor,  # noqa: F811
    quill: Quill,
    name: str,  # noqa: F811
) -> None:
    ws = await created(stack, quill, name, LimitsPatch(max_checkout_bytes=2 * MIB))  # noqa: F811
    await ws.write("a.txt", "kept\n")
    sh = await ws.shell()
    with pytest.raises(QuillError) as over:  # before: 0, and 3 MB committed
        await sh.run("for f in 1 2; do head -c 1500K /dev/zero > big$f.bin; done; sleep 30")
    assert over.value.code == ErrorCode.SIZE_LIMIT_EXCEEDED
    with pytest.raises(QuillError) as gone:  # the shell was stopped with it
        await sh.run("true")
    assert gone.value.code == ErrorCode.SHELL_NOT_FOUND
    assert [e.path for e in (await ws.list("")).entries] == ["a.txt"]
    # background work too, between commands
    sh = await ws.shell()
    await sh.run(
        "(sleep 0.2; for f in 1 2; do head -c 1500K /dev/zero > bg$f.bin; done; sleep 30) "
        ">/dev/null 2>&1 &"
    )

    async def stopped() -> bool:
        return sh.id not in [s.shell for s in (await ws.running()).shells]

    await eventually(stopped, what="the shell stopped over its quota")
    assert [e.path for e in (await ws.list("")).entries] == ["a.txt"]
    assert (await ws.exec("cat a.txt")).stdout == "kept\n"


async def test_a_shells_checkout_counts_against_the_checkouts_budget(
    stack: StartExecutor,  # noqa: F811
    quill: Quill,
    name: str,  # noqa: F811
) -> None:
    executor = await stack()  # noqa: F811
    ws, other = quill.workspace(name), quill.workspace(name[:40] + "-other-" + name[-5:])  # noqa: F811
    await ws.create()
    await other.create()
    await other.exec("true")
    async with await ws.shell() as sh:
        home = executor.shells.held[sh.id].checkout.home
        await sh.run("mkdir -p node_modules && head -c 2M /dev/zero > node_modules/cache")
        executor.checkouts.budget.budget = 3 * MIB
        # held for the shell's life, as a running command's checkout is (before: never)
        await eventually(lambda: executor.checkouts.pinned.get(home, 0) >= 2 * MIB)
        with pytest.raises(QuillError) as over:
            await other.exec("mkdir -p node_modules && head -c 2M /dev/zero > node_modules/x")
        assert over.value.code == ErrorCode.SIZE_LIMIT_EXCEEDED
        assert over.value.details["limit"] == "checkouts_budget"
    assert home not in executor.checkouts.pinned  # closed: its room is the others' again
    r = await other.exec("mkdir -p node_modules && head -c 2M /dev/zero > node_modules/x")
    assert r.exit_code == 0
