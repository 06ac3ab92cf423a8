"""The shell's command server: the program a shell's sandbox runs (``SUPERVISOR`` and the
evaluating bash it starts, ``LOOP``) and the framing of what it writes back (``Running``: a
command's output up to its tokens, and its status).

Apart from ``services.executor.shells`` (which opens, routes and closes shells, and commits
their work): both ends of one protocol in one place, as ``terminal``'s relay is, and nothing
of the executor in it.

The sandbox. A shell is ``Provider.start`` of ``python3 -c SUPERVISOR LOOP`` with a live
stdin (bwrap: one box, its own PID namespace and cgroup; local: one process group), for at
most its lifetime. Why a supervisor: a token the evaluating shell held would be in its
variables, and ``set`` would print it (ending the command), or a command could forge its end
with it. So the supervisor (not dumpable: its ``/proc`` entries are root's) holds the tokens
and starts the evaluating bash (``LOOP``) with two pipes: it reads ``<token> <n>\\n`` and the
command's ``n`` bytes from its stdin, writes ``<n>\\n``, the bytes and a random nonce to bash,
which ``eval``\\ s the bytes in its main shell (so ``cd``, ``export`` and functions stay; both
pipes closed and stdin ``/dev/null`` while the command runs), then reads the nonce and writes
``<nonce> <status>`` back; on that line (anything else on the pipe is dropped) the supervisor
writes the token alone to stdout and the token with the status to stderr. The token on
stdout says where the command's stdout ends (what comes after is a background process's),
the one on stderr where its stderr ends and how it ended. Neither token nor nonce is in the
evaluating shell while a command runs. (A command can still do all its shell can: ``exec``
something else in its place, or open its descriptors through ``/proc/$$/fd``, and so speak
the server's side: it can end its own command early or garble its own shell's next commands,
nothing else.) Output of background processes while a command runs is that command's;
between commands it is counted and dropped. A command that runs ``exit`` ends its shell (as
in a terminal); one past its timeout ends its shell too (its processes cannot be told from
the shell's).
"""

from __future__ import annotations

import asyncio
import re
import time

from infra.exec.sandbox.interface import OnOutput, StreamName

PRIVATE_TMP = (
    't=$1; shift; mkdir -p "$HOME/.tmp" && exec 8<"$t" 9<"$HOME" && '
    'mount --bind "$HOME/.tmp" /tmp && mkdir -p "$HOME" "$t" && '
    'mount -c --bind /proc/self/fd/9 "$HOME" && mount -c --bind /proc/self/fd/8 "$t" && '
    'exec 8<&- 9<&- && cd "$PWD" && exec "$@"'
)
"""A local shell as root: in a mount namespace of its own, ``/tmp`` is a directory of its
private HOME (the host's is not shared with it, nor with other shells); HOME and the checkout
(``$1``), when under the host's /tmp, are bound back where they were. (Not root: no mount
namespace; the host's /tmp.)"""
SERVER_PROCESSES = 2
"""The shell's own processes in its sandbox: the supervisor and the evaluating bash."""
STATUS = re.compile(rb"([0-9a-f]{32})([0-9]{1,3})\n")

LOOP = r"""
exec {__quill_in}<&"$1" {__quill_st}>&"$2" </dev/null
eval "exec $1<&- $2>&-"
set --
while IFS=' ' read -r -u "$__quill_in" __quill_n __quill_stdin; do
  LC_ALL=C IFS= read -r -d '' -N "$__quill_n" -u "$__quill_in" __quill_cmd
  eval "$__quill_cmd" {__quill_in}<&- {__quill_st}>&- <"${__quill_stdin:-/dev/null}"
  __quill_at=$?
  IFS= read -r -u "$__quill_in" __quill_end
  printf '%s %d\n' "$__quill_end" "$__quill_at" >&"$__quill_st"
  __quill_end=
done
"""
"""The evaluating shell: reads ``<n>\\n``, ``n`` bytes and a line on its descriptor ``$1``,
``eval``\\ s the bytes with that descriptor and ``$2`` closed and stdin ``/dev/null``, then
reads the line (a nonce the supervisor wrote after the command: in no variable while the
command runs) and writes ``<nonce> <status>`` on ``$2``. It never sees a token."""

SUPERVISOR = r"""
import os, sys, threading
try:
    import ctypes
    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: no /proc/<pid>/mem, fd, environ
except Exception:
    pass
LOOP = sys.argv[1]
req_r, req_w = os.pipe()
st_r, st_w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(req_w)
    os.close(st_r)
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.set_inheritable(req_r, True)
    os.set_inheritable(st_w, True)
    os.execvp("bash", ["bash", "-c", LOOP, "bash", str(req_r), str(st_w)])
os.close(req_r)
os.close(st_w)
inp = os.fdopen(0, "rb", buffering=0)
def exact(n):
    buf = b""
    while len(buf) < n:
        c = inp.read(n - len(buf))
        if not c:
            return None
        buf += c
    return buf
def head():
    buf = b""
    while not buf.endswith(b"\n") and len(buf) < 100:
        c = inp.read(1)
        if not c:
            return None
        buf += c
    return buf
def put(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
def feed(fifo, given):
    try:
        with open(fifo, "wb") as w:
            w.write(given)
    except OSError:
        pass
stdin_dir = os.path.join(os.environ.get("TMPDIR") or "/tmp", ".quill-stdin-%d" % os.getpid())
os.makedirs(stdin_dir, mode=0o700, exist_ok=True)
pending = b""
while True:
    line = head()
    parts = line.split() if line else []
    if len(parts) != 3 or not parts[1].isdigit() or not parts[2].lstrip(b"-").isdigit():
        break
    token, n, m = parts[0], int(parts[1]), int(parts[2])
    data = exact(n)
    given = exact(m) if m >= 0 else None
    if data is None or (m >= 0 and given is None):
        break
    nonce = os.urandom(16).hex().encode()
    fifo = b""
    if given is not None:  # the command's stdin: a FIFO its eval opens, fed by a thread
        fifo = os.path.join(os.fsencode(stdin_dir), nonce)
        os.mkfifo(fifo, 0o600)
        threading.Thread(target=feed, args=(fifo, given), daemon=True).start()
    try:
        put(req_w, b"%d %s\n" % (n, fifo) + data + nonce + b"\n")
    except OSError:
        break
    code = None
    while code is None:
        at = pending.find(nonce + b" ")
        end = pending.find(b"\n", at) if at >= 0 else -1
        if end >= 0:
            digits = pending[at + len(nonce) + 1 : end]
            pending = pending[end + 1 :]
            code = int(digits) if digits.isdigit() and len(digits) <= 3 else 1
            break
        chunk = os.read(st_r, 4096)
        if not chunk:
            break
        pending = (pending + chunk)[-4096:]  # all but the nonce's line: forged, dropped
    if code is None:
        break
    if fifo:
        try:
            os.unlink(fifo)
        except OSError:
            pass
    put(1, token)
    put(2, token + b"%d\n" % code)
os.close(req_w)
_, st = os.waitpid(pid, 0)
sys.exit(os.WEXITSTATUS(st) if os.WIFEXITED(st) else 128 + os.WTERMSIG(st))
"""
"""The shell's command server (see the module docstring): a supervisor outside the evaluating
shell (``LOOP``), holding the tokens."""


class Running:
    """One command's output as the shell writes it, up to its tokens."""

    def __init__(self, handle: str, command: str, token: str, on_output: OnOutput) -> None:
        self.handle, self.command = handle, command
        self.token = token.encode()
        self.on_output = on_output
        self.carry = {"stdout": b"", "stderr": b""}
        self.done = {"stdout": False, "stderr": False}
        self.counts = {"stdout": 0, "stderr": 0}
        self.status: int | None = None
        self.ended = asyncio.Event()
        self.started = time.monotonic()

    async def feed(self, stream: StreamName, chunk: bytes) -> None:
        if self.done[stream]:
            return  # a background process's, after the command's end
        data = self.carry[stream] + chunk
        self.carry[stream] = b""
        at = data.find(self.token)
        if at >= 0:
            end: re.Match[bytes] | None = None
            if stream == "stderr":
                end = STATUS.match(data, at)
                if end is None or end.group(1) != self.token:
                    if len(data) - at < len(self.token) + 5:  # its status may be on the way
                        await self._emit(stream, data[:at])
                        self.carry[stream] = data[at:]
                        return
                    end = None
            if stream == "stdout" or end is not None:
                await self._emit(stream, data[:at])
                self.done[stream] = True
                if end is not None:
                    self.status = int(end.group(2))
                if all(self.done.values()):
                    self.ended.set()
                return
        keep = _prefix_kept(data, self.token)
        await self._emit(stream, data[: len(data) - keep])
        self.carry[stream] = data[len(data) - keep :]

    async def _emit(self, stream: StreamName, data: bytes) -> None:
        if data:
            self.counts[stream] += len(data)
            await self.on_output(stream, data)

    async def flush(self) -> None:
        """What was held back (the shell ended without its tokens)."""
        for stream in ("stdout", "stderr"):
            data, self.carry[stream] = self.carry[stream], b""
            await self._emit(stream, data)


def _prefix_kept(data: bytes, token: bytes) -> int:
    """How many bytes at the end of ``data`` may start ``token`` (held for the next chunk)."""
    for n in range(min(len(token) - 1, len(data)), 0, -1):
        if token.startswith(data[-n:]):
            return n
    return 0
