"""The supervisor's restart delays (``quill_cli/supervisor.py``): doubling, capped, reset after a
long enough run, and ``$QUILL_RESTART_BACKOFF``."""

from __future__ import annotations

import pytest

from quill_cli.supervisor import Backoff, describe_exit


def test_the_delay_doubles_with_each_exit_in_a_row_up_to_the_cap() -> None:
    backoff = Backoff(0.5, 30.0)
    delays = [backoff.failed(ran_s=1.0) for _ in range(9)]
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert backoff.exits == 9


def test_a_child_that_stayed_up_twice_the_cap_starts_the_count_again() -> None:
    backoff = Backoff(0.5, 30.0)
    for _ in range(5):
        backoff.failed(ran_s=59.9)
    assert backoff.failed(ran_s=60.0) == 0.5
    assert backoff.failed(ran_s=3.0) == 1.0


def test_it_never_overflows() -> None:
    backoff = Backoff(0.5, 30.0)
    delays = [backoff.failed(0.0) for _ in range(2000)]
    assert delays[-1] == 30.0 and max(delays) == 30.0


def test_the_environment_sets_first_and_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QUILL_RESTART_BACKOFF", raising=False)
    assert (Backoff.from_env().first, Backoff.from_env().cap) == (0.5, 30.0)
    monkeypatch.setenv("QUILL_RESTART_BACKOFF", "0.2, 5")
    assert (Backoff.from_env().first, Backoff.from_env().cap) == (0.2, 5.0)
    for bad in ("1", "a,b", "0,1", "5,1", "1,2,3"):
        monkeypatch.setenv("QUILL_RESTART_BACKOFF", bad)
        with pytest.raises(ValueError, match="QUILL_RESTART_BACKOFF"):
            Backoff.from_env()


def test_exits_are_described() -> None:
    assert describe_exit(-9) == "killed by SIGKILL"
    assert describe_exit(3) == "code 3"
