"""The frame of the small python scripts a bwrap sandbox's command is started through (the
egress ``forwarder`` and the ``ports`` agent): one place for the part they share.

Each script opens its socket first, then forks the command (the child closes that socket and
execs the command, exiting 127/126 as a shell would when it cannot), ignores SIGINT, SIGTERM,
SIGHUP and SIGQUIT, keeps no standard stream open, starts its own daemon threads, and exits as
the command did (by the same signal, or with the same code).
"""

from __future__ import annotations

_IMPORTS = "\nimport os, signal, socket, sys, threading\n"

_FORK = r"""pid = os.fork()
if pid == 0:
    HELD.close()
    try:
        os.execvp(argv[0], argv)
    except OSError as e:
        os.write(2, ("%s: %s\n" % (argv[0], e.strerror)).encode())
        os._exit(127 if isinstance(e, FileNotFoundError) else 126)
for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
    signal.signal(sig, signal.SIG_IGN)
null = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)
threading.stack_size(256 * 1024)
"""

_WAIT = r"""while True:
    try:
        _, status = os.waitpid(pid, 0)
        break
    except InterruptedError:
        continue
if os.WIFSIGNALED(status):
    signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
    os.kill(os.getpid(), os.WTERMSIG(status))
os._exit(os.waitstatus_to_exitcode(status))
"""


def script(*, setup: str, held: str, serve: str) -> str:
    """The script: ``setup`` (sets ``argv`` and opens the socket named ``held``), the fork and
    exec of the command, then ``serve`` (starts the daemon threads), then the wait."""
    return _IMPORTS + setup + _FORK.replace("HELD", held) + serve + _WAIT
