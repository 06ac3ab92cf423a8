"""``proctree.send`` counts the processes it found, oldest first: killing one can end others
before their turn (a parent's death signal to its child, a PID namespace whose init ended),
and those refuse the signal as gone although they were there (a shell's close counted 0 to 2
of its 2 background jobs under load)."""

from __future__ import annotations

import os
import signal
import subprocess

from infra.exec.sandbox import proctree


def test_a_process_gone_before_its_turn_is_counted() -> None:
    done = subprocess.Popen(["true"])
    fd = os.pidfd_open(done.pid)
    done.wait()  # gone (reaped): the signal is refused as ESRCH
    alive = subprocess.Popen(["sleep", "60"])
    try:
        found = [
            proctree.Found((done.pid, 1), fd),
            proctree.Found((alive.pid, 2), os.pidfd_open(alive.pid)),
        ]
        assert proctree.send(lambda: found, signal.SIGKILL) == 2
        assert alive.wait(timeout=10) == -signal.SIGKILL
    finally:
        if alive.poll() is None:
            alive.kill()
            alive.wait()


def test_oldest_first_and_the_one_spared() -> None:
    procs = [subprocess.Popen(["sleep", "60"]) for _ in range(3)]
    order: list[int] = []
    real = signal.pidfd_send_signal
    by_fd: dict[int, int] = {}

    def recording(fd: int, signum: int) -> None:
        order.append(by_fd[fd])
        real(fd, signum)

    try:
        found = []
        for n, p in enumerate(procs):
            fd = os.pidfd_open(p.pid)
            by_fd[fd] = p.pid
            found.append(proctree.Found((p.pid, n), fd))
        signal.pidfd_send_signal = recording  # type: ignore[assignment]
        try:
            sent = proctree.send(lambda: found, signal.SIGKILL, but=procs[0].pid)
        finally:
            signal.pidfd_send_signal = real
        assert sent == 2 and order == [procs[1].pid, procs[2].pid]
        assert procs[0].poll() is None  # spared
    finally:
        for p in procs:
            p.kill()
            p.wait()
