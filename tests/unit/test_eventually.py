"""``tests.helpers.eventually``: the one way tests wait for a condition nothing signals."""

from __future__ import annotations

import pytest

from tests.helpers import eventually, eventually_sync


async def test_it_returns_the_first_true_answer_of_a_sync_or_async_condition() -> None:
    asked = []

    def third() -> list[int]:
        asked.append(len(asked))
        return asked if len(asked) == 3 else []

    assert await eventually(third) == [0, 1, 2]

    async def soon() -> str:
        asked.append(len(asked))
        return "yes" if len(asked) > 5 else ""

    assert await eventually(soon) == "yes"


async def test_a_failure_says_what_was_awaited_and_the_last_answer() -> None:
    state = {"count": 1}
    with pytest.raises(AssertionError) as failed:
        await eventually(lambda: state["count"] == 2, timeout=0.05)
    said = str(failed.value)
    assert said.startswith("not within 0.05 s: ") and 'state["count"] == 2' in said
    assert said.endswith("(last answer: False)")

    async def ready() -> bool:
        """The thing is ready."""
        return False

    with pytest.raises(AssertionError, match=r"ready: The thing is ready\. \(last"):
        await eventually(ready, timeout=0.05)
    with pytest.raises(AssertionError, match="the server's answer"):
        await eventually(lambda: None, 0.05, "the server's answer")

    def wordy() -> bool:
        raise ValueError("x" * 10_000)

    with pytest.raises(AssertionError) as long:  # the last answer, cut short
        await eventually(wordy, 0.05, "a long answer", ignoring=(ValueError,))
    assert len(str(long.value)) < 600


async def test_exceptions_it_ignores_mean_not_yet_others_fail_at_once() -> None:
    tries = []

    def flaky() -> bool:
        tries.append(1)
        if len(tries) < 3:
            raise ConnectionError("not yet")
        return True

    def down() -> bool:
        raise ConnectionError("down")

    assert await eventually(flaky, ignoring=(ConnectionError,))
    with pytest.raises(AssertionError, match=r"ConnectionError\('down'\)"):
        await eventually(down, 0.05, ignoring=(ConnectionError,))
    with pytest.raises(ValueError):
        await eventually(lambda: int("x"))


async def test_a_timeout_of_the_condition_itself_is_not_taken_for_its_own() -> None:
    async def times_out() -> bool:
        raise TimeoutError("the condition's request")

    with pytest.raises(TimeoutError, match="the condition's request"):
        await eventually(times_out)


def test_the_sync_variant_waits_the_same_way() -> None:
    asked: list[int] = []
    assert eventually_sync(lambda: asked.append(1) or len(asked) >= 3)
    with pytest.raises(AssertionError, match=r"not within 0.05 s: nothing \(last answer: 0\)"):
        eventually_sync(lambda: 0, 0.05, "nothing")
