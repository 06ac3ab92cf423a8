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
ACK = re.compile(rb"([0-9a-f]{32})!([ics])([0-9]{0,9})\n")
"""The server's answer to a frame sent while a command runs (``Running.acks``)."""

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
import os, select, sys, threading
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
def kids(p):
    out = []
    try:
        tids = os.listdir("/proc/%d/task" % p)
    except OSError:
        return out
    for t in tids:
        try:
            with open("/proc/%d/task/%s/children" % (p, t), "rb") as f:
                out += [int(c) for c in f.read().split()]
        except (OSError, ValueError):
            pass
    return out
def tree(roots):
    seen, todo = set(), list(roots)
    while todo:
        p = todo.pop()
        if p not in seen and p != pid and p != os.getpid():
            seen.add(p)
            todo += kids(p)
    return seen
def send(signum, before):
    # the command's processes: the shell's children forked since it began, and theirs
    hit = set()
    for _ in range(3):  # again for what forked meanwhile
        new = tree(set(kids(pid)) - before) - hit
        if not new:
            break
        for p in new:
            try:
                os.kill(p, signum)
                hit.add(p)
            except OSError:
                pass
    return len(hit)
def opened(fd):
    # the evaluating bash has the FIFO as its stdin (its eval opened it): closing our end
    # before would leave that open waiting for a writer for good
    try:
        st, mine = os.stat("/proc/%d/fd/0" % pid), os.fstat(fd)
    except OSError:
        return True
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)
def ack(token, kind, value=0):
    put(2, token + b"!%s%d\n" % (kind, value))
stdin_dir = os.path.join(os.environ.get("TMPDIR") or "/tmp", ".quill-stdin-%d" % os.getpid())
os.makedirs(stdin_dir, mode=0o700, exist_ok=True)
pending = b""
while True:
    line = head()
    parts = line.split() if line else []
    if parts[:1] == [b"!i"] and len(parts) == 2 and parts[1].isdigit():
        if exact(int(parts[1])) is None:  # input to a command that has ended: dropped
            break
        continue
    if parts[:1] in ([b"!c"], [b"!e"], [b"!s"]):
        continue
    if len(parts) != 3 or not parts[1].isdigit() or not parts[2].lstrip(b"-").isdigit():
        break
    token, n, m = parts[0], int(parts[1]), int(parts[2])
    data = exact(n)
    given = exact(m) if m >= 0 else None
    if data is None or (m >= 0 and given is None):
        break
    nonce = os.urandom(16).hex().encode()
    fifo = b""
    wfd = -1
    if given is not None or m == -2:  # the command's stdin: a FIFO its eval opens
        fifo = os.path.join(os.fsencode(stdin_dir), nonce)
        os.mkfifo(fifo, 0o600)
        if m == -2:  # live: written as exec.input comes
            wfd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
        else:
            threading.Thread(target=feed, args=(fifo, given), daemon=True).start()
    before = set(kids(pid))
    try:
        put(req_w, b"%d %s\n" % (n, fifo) + data + nonce + b"\n")
    except OSError:
        break
    code, gone = None, False
    queued, sent, asked, closing = b"", 0, False, False
    while code is None:
        at = pending.find(nonce + b" ")
        end = pending.find(b"\n", at) if at >= 0 else -1
        if end >= 0:
            digits = pending[at + len(nonce) + 1 : end]
            pending = pending[end + 1 :]
            code = int(digits) if digits.isdigit() and len(digits) <= 3 else 1
            break
        ready = [st_r] if gone else [st_r, 0]
        late = 0.02 if closing and wfd >= 0 else None  # its end waits for the eval's open
        r, w, _ = select.select(ready, [wfd] if queued and wfd >= 0 else [], [], late)
        if w:
            try:
                k = os.write(wfd, queued)
                queued, sent = queued[k:], sent + k
            except BlockingIOError:
                pass
            except OSError:
                queued = b""
        if asked and not queued:
            ack(token, b"i", sent)
            asked = False
        if closing and not queued and wfd >= 0 and opened(wfd):
            os.close(wfd)
            wfd = -1
        if 0 in r:
            frame = head()
            words = frame.split() if frame else []
            if not words:
                gone = True  # the executor is gone: the command runs out, then the server ends
            elif words[0] == b"!i" and len(words) == 2 and words[1].isdigit():
                more = exact(int(words[1]))
                if more is None:
                    gone = True
                elif wfd >= 0 and not closing:
                    queued, sent, asked = queued + more, 0, True
                else:
                    ack(token, b"i", 0)
            elif words[0] == b"!c":  # what the command did not read in time is dropped
                if asked:
                    ack(token, b"i", sent)
                queued, asked = b"", False
                ack(token, b"c")
            elif words[0] == b"!e":
                closing = True
            elif words[0] == b"!s" and len(words) == 2 and words[1].isdigit():
                ack(token, b"s", send(int(words[1]), before))
        if st_r in r:
            chunk = os.read(st_r, 4096)
            if not chunk:
                break
            pending = (pending + chunk)[-4096:]  # all but the nonce's line: forged, dropped
    if wfd >= 0:
        os.close(wfd)
    if asked:
        ack(token, b"i", sent)
    if code is None:
        break
    if fifo:
        try:
            os.unlink(fifo)
        except OSError:
            pass
    put(1, token)
    put(2, token + b"%d\n" % code)
    if gone:
        break
os.close(req_w)
_, st = os.waitpid(pid, 0)
sys.exit(os.WEXITSTATUS(st) if os.WIFEXITED(st) else 128 + os.WTERMSIG(st))
"""
"""The shell's command server (see the module docstring): a supervisor outside the evaluating
shell (``LOOP``), holding the tokens."""


class Running:
    """One command's output as the shell writes it, up to its tokens; and the server's
    answers to what was sent to it while the command runs (``acks``: ``("i", bytes
    written)``, ``("c", 0)``, ``("s", processes signalled)``)."""

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
        self.acks: asyncio.Queue[tuple[str, int]] = asyncio.Queue()

    async def feed(self, stream: StreamName, chunk: bytes) -> None:
        if self.done[stream]:
            return  # a background process's, after the command's end
        data = self.carry[stream] + chunk
        self.carry[stream] = b""
        while True:
            at = data.find(self.token)
            if at < 0:
                break
            end: re.Match[bytes] | None = None
            if stream == "stderr":
                ack = ACK.match(data, at)
                if ack is not None and ack.group(1) == self.token:
                    await self._emit(stream, data[:at])
                    self.acks.put_nowait((ack.group(2).decode(), int(ack.group(3) or 0)))
                    data = data[ack.end() :]
                    continue
                end = STATUS.match(data, at)
                if end is None or end.group(1) != self.token:
                    if len(data) - at < len(self.token) + 12 and b"\n" not in data[at:]:
                        await self._emit(stream, data[:at])  # its status or an answer may
                        self.carry[stream] = data[at:]  # be on the way
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
            break
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
