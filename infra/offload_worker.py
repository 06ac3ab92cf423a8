"""A worker process of ``infra/offload.py``: runs pure ``core`` functions, one at a time.

``python -m infra.offload_worker`` reads requests on stdin and writes replies on stdout, each
a frame: 8 bytes of length (big-endian) and a pickle. A request is ``(function, args,
budget_s, wall_s)``: the function is called as ``function(*args, remaining=...)``,
``remaining()`` being the seconds left of its budgets. ``budget_s`` is CPU time (the
process's: what the work costs, however busy the machine is), ``wall_s`` the time its client
waits. At either a signal (``SIGPROF``, ``SIGALRM``) raises ``TimeoutError`` inside the
function (pure Python code such as ``difflib`` checks no clock, and the regular expression
engines stop at signals; the function may catch it to say what it was doing); the parent
kills the process if no reply comes soon after. A reply is ``("ok", value)``, ``("error",
QuillError)``, ``("timeout", None)`` or ``("crash", text)``.

Only functions of ``core`` are run: the frames come from the service that started the
process, over its pipe, and name code by reference (pickle), never send it.

The process runs under Linux's ``SCHED_IDLE`` policy, on the upper half of the CPUs its
service may use (``idle``: its parent sets both as soon as it exists, so that even its
start-up imports take no CPU from the services): it gets a CPU only when nothing else wants
it, a service's event loop that wakes up to answer a request takes the CPU from it at once,
and the lower half of the CPUs (their caches included: a ``difflib`` or a backtracking regex
at ``SCHED_IDLE`` on every CPU still tripled the tail latency of reads, measured; on half of
them, it did not) is the services' alone. So what a worker computes for one client takes the
CPU the services leave, not theirs. Where the policy is not available, the lowest priority
(``nice`` 19) instead.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pickle
import signal
import struct
import sys
import time
from collections.abc import Callable
from typing import Any, BinaryIO

from contracts.errors import QuillError

HEADER = struct.Struct("!Q")


def idle(pid: int) -> None:
    """Give process ``pid`` a CPU only when nothing else wants it, and only the upper half of
    the CPUs this process may use (all of them when there is one)."""
    try:
        os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):  # not Linux: the lowest priority instead
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, pid, 19)
    try:
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(pid, cpus[len(cpus) // 2 :])
    except (AttributeError, OSError):
        pass


def _die_with_parent() -> None:
    """Be killed when the service that started us ends (even by ``SIGKILL``): a worker never
    runs on for a service that is gone."""
    parent = os.getppid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (AttributeError, OSError):  # not Linux: it ends at its next read (end of file)
        return
    if os.getppid() != parent:  # the service ended before the request took
        os._exit(0)


PR_SET_PDEATHSIG = 1


def prepare() -> None:
    """Import what the jobs run, and build the tables they use, before the first job."""
    import core.diffs
    import core.finding
    import core.matches
    import core.regexes
    import core.textops  # noqa: F401

    core.regexes.UserPattern(r"\w\d\s", "m")


_armed = False


def _overtime(signum: int, frame: Any) -> None:
    global _armed
    if _armed:
        _armed = False
        raise TimeoutError


def run(
    fn: Callable[..., Any], args: tuple[Any, ...], budget_s: float, wall_s: float
) -> tuple[str, Any]:
    """``fn(*args)`` within ``budget_s`` seconds of CPU and ``wall_s`` of time, as a reply."""
    global _armed
    if not getattr(fn, "__module__", "").startswith("core."):
        return ("crash", f"refused to run {fn!r}: not a function of core")
    cpu_deadline = time.process_time() + budget_s
    deadline = time.monotonic() + wall_s

    def remaining() -> float:
        return min(cpu_deadline - time.process_time(), deadline - time.monotonic())

    _armed = True
    signal.setitimer(signal.ITIMER_PROF, max(budget_s, 0.001))
    signal.setitimer(signal.ITIMER_REAL, max(wall_s, 0.001))
    try:
        return ("ok", fn(*args, remaining=remaining))
    except QuillError as exc:
        return ("error", exc)
    except TimeoutError:
        return ("timeout", None)
    except Exception as exc:  # a bug: said to the caller, who answers INTERNAL
        return ("crash", f"{type(exc).__name__}: {exc}")
    finally:
        _armed = False
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.setitimer(signal.ITIMER_REAL, 0)


def _read(stream: BinaryIO, size: int) -> bytes | None:
    data = stream.read(size)
    return data if len(data) == size else None


def serve(requests: BinaryIO, replies: BinaryIO) -> None:
    """Answer frames until ``requests`` ends."""
    while (header := _read(requests, HEADER.size)) is not None:
        frame = _read(requests, HEADER.unpack(header)[0])
        if frame is None:
            return
        fn, args, budget_s, wall_s = pickle.loads(frame)
        reply = run(fn, args, budget_s, wall_s)
        try:
            data = pickle.dumps(reply, pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            data = pickle.dumps(("crash", f"unpicklable result: {exc}"), pickle.HIGHEST_PROTOCOL)
        replies.write(HEADER.pack(len(data)) + data)
        replies.flush()


def main() -> None:
    _die_with_parent()
    prepare()
    signal.signal(signal.SIGALRM, _overtime)
    signal.signal(signal.SIGPROF, _overtime)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the service, which stops us
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # a stray print cannot break a frame
    serve(sys.stdin.buffer, replies)


if __name__ == "__main__":
    main()
