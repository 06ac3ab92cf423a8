"""The progress of the log tools (``quill replay``, ``verify``, ``runs``, ``export``,
``import``): a bar drawn with rich on stderr, only on a terminal and without ``--quiet``, once a
phase has run past ``BAR_DELAY_S`` (``quill_cli/tools/replay/`` reports how far it is)."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from typing import cast

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from quill_cli.tools import replay as rpl

BAR_DELAY_S = 1.0
"""A bar appears only for what takes longer than this."""

quiet_option = click.option(
    "--quiet",
    "-q",
    is_flag=True,
    help="No progress bar (there is none either when stdout or stderr is not a terminal).",
)


class Bar:
    """``rpl.Progress`` drawn with rich on stderr, once a phase has run ``BAR_DELAY_S``."""

    def __init__(self, console: Console | None = None) -> None:
        self._console = console or Console(stderr=True)
        self._lock = threading.Lock()
        self._rich: Progress | None = None
        self._task: TaskID | None = None
        self._what, self._total, self._done = "", cast(int | None, None), 0
        self._since = time.monotonic()

    def start(self, what: str, total: int | None) -> None:
        with self._lock:
            if self._rich is not None and self._task is not None:
                self._rich.update(self._task, completed=self._total or self._done)
                self._task = self._rich.add_task(what, total=total)
            self._what, self._total, self._done = what, total, 0

    def update(self, completed: int) -> None:
        with self._lock:
            self._done = completed
            if self._rich is None and time.monotonic() - self._since >= BAR_DELAY_S:
                self._rich = Progress(
                    SpinnerColumn(),
                    TextColumn("{task.description}"),
                    BarColumn(),
                    MofNCompleteColumn(),
                    TimeElapsedColumn(),
                    TimeRemainingColumn(),
                    console=self._console,
                )
                self._rich.start()
                self._task = self._rich.add_task(self._what, total=self._total)
            if self._rich is not None and self._task is not None:
                self._rich.update(self._task, completed=completed)

    def close(self) -> None:
        with self._lock:
            if self._rich is not None:
                self._rich.stop()
                self._rich = None


def _tty() -> bool:
    return sys.stdout.isatty() and sys.stderr.isatty()


@contextlib.contextmanager
def progress(quiet: bool) -> Iterator[rpl.Progress]:
    """A bar on the terminal, or nothing with ``--quiet`` or when not on a terminal."""
    if quiet or not _tty():
        yield rpl.QUIET
        return
    bar = Bar()
    try:
        yield bar
    finally:
        bar.close()
