"""Progress of the log tools (``quill_cli/progress.py``'s bar, ``services/common/replay.each``):
a bar only on a terminal and without ``--quiet``, drawn once a phase runs past a second; work
over many items runs a bounded number at a time and fails with the first failure, leaving
nothing behind."""

from __future__ import annotations

import asyncio
import gc
import io
import warnings

import pytest
from click.testing import CliRunner
from rich.console import Console

from quill_cli import progress
from quill_cli.cli import main
from quill_cli.tools import replay as rpl


def test_no_bar_when_quiet_or_off_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    with progress.progress(quiet=True) as bar:
        assert bar is rpl.QUIET
    monkeypatch.setattr(progress, "_tty", lambda: False)
    with progress.progress(quiet=False) as bar:
        assert bar is rpl.QUIET
    monkeypatch.setattr(progress, "_tty", lambda: True)
    with progress.progress(quiet=False) as bar:
        assert isinstance(bar, progress.Bar)


def test_the_bar_draws_each_phase_once_it_has_run_past_its_delay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out = io.StringIO()
    bar = progress.Bar(Console(file=out, force_terminal=True, width=120))
    bar.start("reading the log of a/b", 1_000)
    bar.update(10)
    assert bar._rich is None  # not yet a second: nothing drawn
    monkeypatch.setattr(progress, "BAR_DELAY_S", 0.0)
    bar.update(500)
    assert bar._rich is not None
    bar.start("writing out", 20)
    bar.update(20)
    tasks = bar._rich.tasks
    assert [(t.description, t.total, t.completed) for t in tasks] == [
        ("reading the log of a/b", 1_000, 1_000),
        ("writing out", 20, 20),
    ]
    bar.close()
    assert "reading the log of a/b" in out.getvalue() and "writing out" in out.getvalue()


@pytest.mark.parametrize("command", ["replay", "verify", "export", "import", "runs"])
def test_every_long_tool_takes_quiet(command: str) -> None:
    result = CliRunner().invoke(main, [command, "--help"])
    assert result.exit_code == 0 and "--quiet" in result.output


class Recorder:
    def __init__(self) -> None:
        self.phases: list[tuple[str, int | None]] = []
        self.completed = 0

    def start(self, what: str, total: int | None) -> None:
        self.phases.append((what, total))

    def update(self, completed: int) -> None:
        self.completed = completed


async def test_each_runs_a_bounded_number_at_a_time_and_reports() -> None:
    running = peak = 0

    async def work(n: int) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0)
        running -= 1

    recorder = Recorder()
    await rpl.each(range(1_000), work, 8, recorder)
    assert peak == 8 and recorder.completed == 1_000


async def test_each_raises_the_first_failure_and_leaves_no_work_behind() -> None:
    taken: list[int] = []
    release = asyncio.Event()

    async def work(n: int) -> None:
        taken.append(n)
        if n == 3:
            raise ValueError("the fourth fails")
        await release.wait()  # the others would run forever: they must be cancelled

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match="the fourth fails"):
            await rpl.each(range(100_000), work, 8)
        gc.collect()
    assert len(taken) <= 16  # items were taken as workers got to them, not all at once
    assert not [w for w in caught if "never awaited" in str(w.message)]
