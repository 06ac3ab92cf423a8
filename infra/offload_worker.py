"""A worker process of ``infra/offload.py``: runs pure ``core`` functions, one at a time.

``python -m infra.offload_worker`` reads requests on stdin and writes replies on stdout, each
a frame: 8 bytes of length (big-endian) and a pickle. A request is ``(function, args,
budget_s)``: the function is called as ``function(*args, remaining=...)``, ``remaining()``
being the seconds left of its budget. At the budget a ``SIGALRM`` raises ``TimeoutError``
inside it (pure Python code such as ``difflib`` checks no clock; the function may catch it to
say what it was doing); the parent kills the process if no reply comes soon after. A reply is
``("ok", value)``, ``("error", QuillError)``, ``("timeout", None)`` or ``("crash", text)``.

Only functions of ``core`` are run: the frames come from the service that started the
process, over its pipe, and name code by reference (pickle), never send it. The process runs
at a lower CPU priority (``NICE``) than the services, so that what it computes for one client
takes the CPU the services leave, not theirs.
"""

from __future__ import annotations

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
NICE = 10
"""How much lower the worker's CPU priority is than its service's."""

_armed = False


def _overtime(signum: int, frame: Any) -> None:
    global _armed
    if _armed:
        _armed = False
        raise TimeoutError


def run(fn: Callable[..., Any], args: tuple[Any, ...], budget_s: float) -> tuple[str, Any]:
    """``fn(*args)`` within ``budget_s`` seconds, as a reply."""
    global _armed
    if not getattr(fn, "__module__", "").startswith("core."):
        return ("crash", f"refused to run {fn!r}: not a function of core")
    deadline = time.monotonic() + budget_s

    def remaining() -> float:
        return deadline - time.monotonic()

    _armed = True
    signal.setitimer(signal.ITIMER_REAL, max(budget_s, 0.001))
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
        fn, args, budget_s = pickle.loads(frame)
        reply = run(fn, args, budget_s)
        try:
            data = pickle.dumps(reply, pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            data = pickle.dumps(("crash", f"unpicklable result: {exc}"), pickle.HIGHEST_PROTOCOL)
        replies.write(HEADER.pack(len(data)) + data)
        replies.flush()


def main() -> None:
    os.nice(NICE)
    signal.signal(signal.SIGALRM, _overtime)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the service, which stops us
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # a stray print cannot break a frame
    serve(sys.stdin.buffer, replies)


if __name__ == "__main__":
    main()
