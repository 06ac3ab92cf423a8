"""The CLI, as a person uses it, against ``quill up``."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import resource
import select
import signal
import subprocess
import sys
import threading
from pathlib import Path

from tests.up import PASSWORDS, TENANTS, Up, running


def test_cli_tour(up: Up) -> None:
    assert "created acme/tour" in up.cli("create", "acme/tour").stdout
    out = up.cli("put", "acme/tour", "notes/todo.md", "--text", "# TODO\n- ship\n").stdout
    assert out.startswith("wrote notes/todo.md: 14 bytes")
    up.cli("put", "acme/tour", "notes/todo.md", "-", "--append", input="- test\n")
    assert up.cli("cat", "acme/tour", "notes/todo.md").stdout == "# TODO\n- ship\n- test\n"
    assert (
        up.cli("cat", "acme/tour", "notes/todo.md", "--version", "2").stdout == "# TODO\n- ship\n"
    )
    assert up.cli("cat", "acme/tour", "notes/todo.md", "-n", "--head", "1").stdout == "1: # TODO\n"
    assert up.cli("ls", "acme/tour").stdout == "notes/\n"
    up.cli("mkdir", "acme/tour", "archive/2025")
    up.cli("mv", "acme/tour", "notes/todo.md", "archive/2025/todo.md")
    listing = json.loads(up.cli("--json", "ls", "acme/tour", "archive/2025").stdout)
    assert [e["name"] for e in listing["entries"]] == ["todo.md"]
    stat = json.loads(up.cli("--json", "stat", "acme/tour", "archive/2025/todo.md").stdout)
    assert stat["file_version"] == 1 and stat["size"] == 21
    up.cli("rm", "acme/tour", "archive", "-r")
    assert up.cli("ls", "acme/tour").stdout == "notes/\n"
    history = up.cli("history", "acme/tour", "notes/todo.md").stdout.splitlines()
    assert [line.split()[5] for line in history] == ["deleted", "modified", "created"]
    log = up.cli("log", "acme/tour").stdout.splitlines()
    assert len(log) == 6 and log[0].startswith("v1 ")
    events = json.loads(up.cli("--json", "log", "acme/tour").stdout)["events"]
    assert all(b["prev_hash"] == a["hash"] for a, b in zip(events, events[1:], strict=False))
    audit = up.cli("audit", "acme/tour").stdout
    assert "cmd.create" in audit and "qry.read" in audit


def test_history_follows_a_move(up: Up) -> None:
    up.cli("create", "acme/moves")
    up.cli("put", "acme/moves", "a.txt", "--text", "one\n")  # v2
    up.cli("put", "acme/moves", "a.txt", "--text", "two\n")  # v3
    up.cli("mv", "acme/moves", "a.txt", "b.txt")  # v4
    lines = up.cli("history", "acme/moves", "b.txt").stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["v4", "v3", "v2"]
    assert [line.split()[5] for line in lines] == ["moved", "modified", "created"]
    assert "moved from a.txt" in lines[0] and "(as" not in lines[0]
    assert all("(as a.txt)" in line for line in lines[1:])
    plain = up.cli("history", "acme/moves", "b.txt", "--no-follow").stdout.splitlines()
    assert [line.split()[0] for line in plain] == ["v4"]  # b.txt's own row only
    paged = up.cli("history", "acme/moves", "b.txt", "--limit", "1").stdout.splitlines()
    assert paged[-1] == "(older: quill history acme/moves a.txt --before 4)"
    rest = up.cli("history", "acme/moves", "a.txt", "--before", "4").stdout.splitlines()
    assert [line.split()[0] for line in rest] == ["v3", "v2"]


def test_cli_errors_are_one_line_and_exit_non_zero(up: Up) -> None:
    up.cli("create", "acme/errs")
    assert up.failure("cat", "acme/errs", "nope.txt") == (
        3,
        "quill: FILE_NOT_FOUND: File not found: nope.txt\n",
    )
    escape = up.cli("cat", "acme/errs", "../../etc/passwd", check=False)
    assert escape.returncode == 5
    assert escape.stderr == "quill: ACCESS_DENIED: Access denied. Path must be within /workspace\n"
    bad = up.cli("ls", "Not/Valid", check=False)
    assert bad.returncode == 2 and bad.stderr.startswith(
        "quill: INVALID_ARGUMENT: Invalid tenant id"
    )
    again = up.cli("create", "acme/errs", check=False)
    assert again.returncode == 1 and "ALREADY_EXISTS" in again.stderr
    unreachable = subprocess.run(
        [sys.executable, "-m", "quill", "--nats-url", "nats://127.0.0.1:1", "ls", "acme/errs"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert unreachable.returncode == 6 and unreachable.stderr.startswith("quill: UNAVAILABLE:")
    assert "Traceback" not in unreachable.stderr


def test_watch_prints_updates(up: Up) -> None:
    up.cli("create", "acme/watched")
    env = {"QUILL_NATS_URL": up.nats_url, "PATH": ""}
    watcher = subprocess.Popen(
        [sys.executable, "-m", "quill", "watch", "acme/watched"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert watcher.stdout is not None
        # the watcher subscribes asynchronously: keep writing until it reports one
        line = ""
        for i in range(50):
            up.cli("put", "acme/watched", f"f{i}.txt", "--text", "x")
            ready, _, _ = select.select([watcher.stdout], [], [], 0.2)
            if ready:
                line = watcher.stdout.readline()
                break
        assert line.startswith("v") and " write by cli: f" in line
    finally:
        watcher.kill()
        watcher.wait()
        if watcher.stdout is not None:
            watcher.stdout.close()


def test_cli_tools_edit_grep_glob_tree_diff_restore(up: Up) -> None:
    ws = "acme/tools"
    up.cli("create", ws)
    up.cli("put", ws, "src/app.py", "--text", "import os\n\ndef main():\n    return 1\n")
    up.cli("put", ws, "src/util.py", "--text", "def helper():\n    return 2\n")
    up.cli("put", ws, "README.md", "--text", "# tools\n")
    up.cli("put", ws, ".git/config", "--text", "def hidden\n")

    out = up.cli("edit", ws, "src/app.py", "return 1", "return 42").stdout
    assert out.startswith(
        "edited src/app.py: 1 occurrence replaced, 1 line changed, file version 2"
    )
    assert up.failure("edit", ws, "src/app.py", "return 1", "x") == (
        1,
        "quill: NO_MATCH: OLD not found in the file. The closest text in src/app.py is at"
        " line 4 (differs: OLD has 'return 1' where the file has 'return 42'); nothing"
        " was changed. The file has there:\nreturn 42\n",
    )

    assert (
        up.cli("grep", ws, "^def ").stdout
        == "src/app.py:3:def main():\nsrc/util.py:1:def helper():\n"
    )
    context = up.cli("grep", ws, "return 42", "-C", "1", "--include", "*.py").stdout
    assert context == "src/app.py-3-def main():\nsrc/app.py:4:    return 42\n"
    assert up.cli("grep", ws, "hidden", "--no-exclude").stdout == ".git/config:1:def hidden\n"
    nothing = up.cli("grep", ws, "no such text", check=False)
    assert (nothing.returncode, nothing.stdout, nothing.stderr) == (1, "", "")
    bad = up.cli("grep", ws, "(unclosed", check=False)
    assert bad.returncode == 2 and bad.stderr.startswith("quill: INVALID_ARGUMENT: ")
    capped = up.cli("grep", ws, "def", "--max-results", "1")
    assert len(capped.stdout.splitlines()) == 1
    assert capped.stderr == "quill: 1 of 2 matching lines shown; use --max-results\n"

    assert up.cli("glob", ws, "**/*.py").stdout.splitlines() == [
        "src/app.py",
        "src/util.py",
    ]  # edited last
    assert up.cli("glob", ws, "src", "--type", "directory").stdout == "src/\n"
    assert up.cli("tree", ws).stdout == "src/\n  app.py\n  util.py\nREADME.md\n"
    assert up.cli("ls", ws, "-R").stdout.splitlines() == [
        ".git/", ".git/config", "README.md", "src/", "src/app.py", "src/util.py",
    ]  # fmt: skip

    diff = up.cli("diff", ws, "2", "--path", "src/app.py").stdout
    assert "-    return 1\n+    return 42" in diff and diff.startswith("--- a/src/app.py")
    restored = up.cli("restore", ws, "2", "src/app.py").stdout
    assert restored == "restored src/app.py from version 2 (src/app.py): now workspace version 7\n"
    assert "return 1" in up.cli("cat", ws, "src/app.py").stdout
    again = up.cli("restore", ws, "2", "src/app.py").stdout
    assert again == "unchanged: src/app.py is already as at version 2\n"


def test_cli_exec_streams_and_exits_with_the_status(up: Up) -> None:
    ws = "acme/shell"
    up.cli("create", ws)
    done = up.cli(
        "exec", ws, "--", "echo out; echo err >&2; echo made > made.txt; exit 4", check=False
    )
    assert (done.returncode, done.stdout) == (4, "out\n")
    assert done.stderr.startswith("err\n")
    assert "quill: committed 1 path as version 2" in done.stderr
    words = up.cli("exec", ws, "--", "printf", "%s|", "a b", "c")  # several words: quoted
    assert words.stdout == "a b|c|"
    assert up.cli("cat", ws, "made.txt").stdout == "made\n"
    slow = up.cli("exec", ws, "-t", "0.5", "--", "echo partial; sleep 30", check=False)
    assert slow.returncode == 143 and slow.stdout == "partial\n"
    assert "quill: timed out after" in slow.stderr

    up.cli("exec", ws, "--", "git init -q -b main && git config user.name t")
    status = up.cli("git", ws, "status").stdout
    assert status.startswith("## main") and "untracked" in status and "made.txt" in status
    commit = up.cli("--actor", "alice", "git", ws, "commit", "-m", "first").stdout
    assert commit.startswith("[main ") and commit.endswith("] first\n")
    log = up.cli("git", ws, "log").stdout
    assert log.split()[3:] == ["alice", "first"]


MEASURED = """
import resource, subprocess, sys
done = subprocess.run(sys.argv[1:])
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)
sys.exit(done.returncode)
"""
"""Run argv and print its peak RSS (KiB) as the last line of stderr."""


def _address_space(limit: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def test_put_refuses_a_big_source_without_reading_it(up: Up) -> None:
    up.cli("create", "acme/sizes", "--max-file-bytes", str(1024 * 1024))
    env = {**os.environ, "QUILL_NATS_URL": up.nats_url}
    cli = [sys.executable, "-c", MEASURED, sys.executable, "-m", "quill"]
    small = subprocess.run(
        [*cli, "put", "acme/sizes", "small.txt", "-"],
        input="x",
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert small.returncode == 0, small.stderr
    baseline = int(small.stderr.splitlines()[-1])  # KiB
    # 64 MiB from a pipe: the CLI reads max_file_bytes + 1, refuses, and exits; the writer
    # of the pipe gets SIGPIPE instead of writing it all
    head = subprocess.Popen(["head", "-c", str(64 << 20), "/dev/zero"], stdout=subprocess.PIPE)
    assert head.stdout is not None
    put = subprocess.run(
        [*cli, "put", "acme/sizes", "big.bin", "-"],
        stdin=head.stdout,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        preexec_fn=lambda: _address_space(4 << 30),
    )
    head.stdout.close()
    assert head.wait(60) == -signal.SIGPIPE
    *said, peak = put.stderr.splitlines()
    assert put.returncode == 1, put.stderr
    assert said == [
        "quill: SIZE_LIMIT_EXCEEDED: stdin is over 1048576 bytes, the largest file acme/sizes "
        "takes (max_file_bytes): not sent"
    ]
    assert int(peak) < baseline + 16 * 1024, (baseline, peak)  # it never held the 64 MiB
    # a file that never ends: read up to the limit, refused, the process stays small
    endless = subprocess.run(
        [*cli, "put", "acme/sizes", "big.bin", "/dev/zero"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        preexec_fn=lambda: _address_space(1 << 30),  # before the fix: 23 GB, and killed
    )
    assert endless.returncode == 1, endless.stderr
    assert "SIZE_LIMIT_EXCEEDED: /dev/zero is over 1048576 bytes" in endless.stderr
    assert "Traceback" not in endless.stderr
    fits = up.cli("put", "acme/sizes", "ok.bin", "-", input="x" * 1024 * 1024)
    assert fits.stdout.startswith("wrote ok.bin: 1,048,576 bytes")
    assert up.cli("ls", "acme/sizes").stdout == "ok.bin\nsmall.txt\n"


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class Follower:
    """A ``quill`` command that follows a stream; its stdout and stderr lines are queued as
    they come (a thread per pipe)."""

    def __init__(self, env: dict[str, str], *args: str, sigint_ignored: bool = False) -> None:
        """``sigint_ignored``: started as a script's background job is (``quill watch &``: the
        shell ignores SIGINT for it, and a CI runner may do so for everything it runs)."""
        self.process = subprocess.Popen(
            [sys.executable, "-m", "quill", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            preexec_fn=_ignore_sigint if sigint_ignored else None,
        )
        self.lines: dict[str, queue.Queue[str]] = {"stdout": queue.Queue(), "stderr": queue.Queue()}
        self.pumps = [
            threading.Thread(target=self._pump, args=(name,), daemon=True) for name in self.lines
        ]
        for pump in self.pumps:
            pump.start()

    def _pump(self, name: str) -> None:
        with getattr(self.process, name) as pipe:
            for line in pipe:
                self.lines[name].put(line)

    def line(self, stream: str, deadline_s: float = 30.0) -> str:
        """The next line of ``stream`` (``stdout`` or ``stderr``), waiting up to the deadline."""
        try:
            return self.lines[stream].get(timeout=deadline_s)
        except queue.Empty:
            raise AssertionError(f"nothing on {stream} within {deadline_s}s") from None

    def stop(self) -> list[str]:
        """Interrupt it (Ctrl-C); the lines left on stderr."""
        self.process.send_signal(signal.SIGINT)
        self.process.wait(30)
        for pump in self.pumps:
            pump.join(30)
        left: list[str] = []
        while not self.lines["stderr"].empty():
            left.append(self.lines["stderr"].get())
        return left


def _writes_until_seen(up: Up, ws: str, follower: Follower, start: int) -> str:
    """Write files into ``ws`` until ``follower`` prints a line (it subscribes on its own)."""
    for i in range(start, start + 50):
        up.cli("put", ws, f"f{i}.txt", "--text", "x")
        with contextlib.suppress(AssertionError):
            return follower.line("stdout", 0.2)
    raise AssertionError("the follower printed nothing")


def test_followers_say_once_they_lost_the_server_and_carry_on(tmp_path: Path) -> None:
    data = tmp_path / ".quill"
    stack = Up(data).start()
    port = stack.nats_url.rsplit(":", 1)[1]
    stack.cli("create", "acme/followed")
    env = {**os.environ, "QUILL_NATS_URL": stack.nats_url}
    watch = Follower(env, "watch", "acme/followed")
    audit = Follower(env, "audit", "acme/followed", "--follow")
    try:
        assert " write by cli: f" in _writes_until_seen(stack, "acme/followed", watch, 0)
        assert "cmd.create" in audit.line("stdout")
        assert stack.stop() == 0
        for follower in (watch, audit):
            assert follower.line("stderr").startswith("quill: lost the connection to NATS")
        # back on the same port; meanwhile (starting takes seconds) nothing more is printed
        stack = Up(data, args=("--nats-port", port)).start()
        for follower in (watch, audit):
            assert follower.line("stderr") == "quill: connected to NATS again\n"
            assert follower.process.poll() is None
        assert " write by cli: f" in _writes_until_seen(stack, "acme/followed", watch, 100)
        while "cmd.write" not in audit.line("stdout"):  # what it missed, then the new
            pass
    finally:
        rests = [watch.stop(), audit.stop()]
        if stack.process is not None and stack.process.poll() is None:
            stack.stop()
    assert rests == [[], []]  # one line lost, one line back: nothing else


def test_ctrl_c_ends_followers_while_the_server_is_gone_for_good(tmp_path: Path) -> None:
    """Ctrl-C ends ``watch`` and ``audit --follow`` (exit 130, nothing more said) while the
    client is reconnecting to a server that never comes back, and also when they were started
    with SIGINT ignored (before the fix: ignored, and they followed forever)."""
    stack = Up(tmp_path / ".quill").start()
    stack.cli("create", "acme/gone")
    env = {**os.environ, "QUILL_NATS_URL": stack.nats_url}
    followers = [
        Follower(env, *args, sigint_ignored=ignored)
        for args in (("watch", "acme/gone"), ("audit", "acme/gone", "--follow"))
        for ignored in (False, True)
    ]
    try:
        for i, follower in enumerate(followers[:2]):  # each subscribed
            assert " write by cli: f" in _writes_until_seen(stack, "acme/gone", follower, 100 * i)
        for follower in followers[2:]:
            assert "cmd.create" in follower.line("stdout")
    finally:
        assert stack.stop() == 0
    for follower in followers:
        assert follower.line("stderr").startswith("quill: lost the connection to NATS")
    try:
        rests = [follower.stop() for follower in followers]
    finally:
        for follower in followers:
            if follower.process.poll() is None:
                follower.process.kill()
    assert [follower.process.returncode for follower in followers] == [130] * 4
    assert rests == [[]] * 4


def test_watch_of_a_workspace_the_tenant_may_not_read_exits(tmp_path: Path) -> None:
    with running(tmp_path / ".quill", tenants=TENANTS) as stack:
        env = {"QUILL_NATS_USER": "b", "QUILL_NATS_PASSWORD": PASSWORDS["b"]}
        done = stack.cli("watch", "a/shared", check=False, env=env)
        assert done.returncode == 5, done
        assert done.stderr.startswith("quill: ACCESS_DENIED: NATS refused ws.updated.a.shared")
        assert done.stderr.count("\n") == 1, done.stderr


def test_cli_shell_open_exec_close(up: Up) -> None:
    ws = "acme/cli-shell"
    up.cli("create", ws)
    shell = up.cli("shell-open", ws).stdout.strip()
    assert shell.startswith("s")
    up.cli("exec", ws, "--shell", shell, "--", "mkdir -p d && cd d && export X=7; sleep 1000 &")
    done = up.cli("exec", ws, "--shell", shell, "--", 'pwd; echo "$X"; echo x > f.txt')
    assert done.stdout.splitlines()[0].endswith("/d") and done.stdout.splitlines()[1] == "7"
    assert "quill: committed 1 path" in done.stderr
    closed = up.cli("shell-close", ws, shell)
    assert closed.stdout == f"closed {shell}: 1 process killed\n"
    gone = up.cli("exec", ws, "--shell", shell, "--", "true", check=False)
    assert gone.returncode != 0 and "SHELL_NOT_FOUND" in gone.stderr
