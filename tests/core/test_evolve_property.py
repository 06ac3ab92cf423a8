"""One fold (``core.evolve``): a log folded from scratch is what the writer holds.

Hypothesis draws sequences of commands over a few paths, sessions, runs and approvals
(``tests/core/evolving.py``: writes and appends, mkdirs, deletes, moves, an executor's apply
with the paths it left uncommitted, locks, trust, archive, runs, attachments, approvals asked
with short and long deadlines and decided, purges and creations again). They are decided as
the writer decides them: ``core.decide`` against the state the ones before left, each event
folded onto it with ``evolve(tree=False)`` (its decider applied its changes already). After
each command, the log folded from nothing with ``evolve`` (its changes applied by ``evolve``)
is that state. The projection's ``load``, compactions, ``quill replay``'s fold and a real
writer over NATS: ``tests/integration/test_evolve_property.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings

from tests.core.evolving import Decided, commands, decided, folded, norm


@settings(max_examples=150, deadline=None)
@given(script=commands())
def test_the_fold_is_what_the_writer_holds(script: list[tuple[Any, ...]]) -> None:
    decided(script)  # checked after each command


def test_the_normal_form_tells_states_apart() -> None:
    """The comparison can fail: states one event apart differ."""
    writer = Decided("demo")
    writer.run(("create", "full"))
    before = norm(folded(writer.log))
    writer.run(("lock", "s1"))
    assert norm(folded(writer.log)) != before
    writer.run(("write", "a", "x", False, "s1"))
    assert norm(folded(writer.log)) != norm(folded(writer.log[:-1]))


@pytest.mark.parametrize("expires", [2, 3600])
def test_an_approval_past_its_deadline_is_expired_by_the_next_one(expires: int) -> None:
    """The fold decides expiry from the log alone (an event's time), the same everywhere."""
    writer = Decided("demo")
    writer.run(("create", "full"))
    writer.run(("ask", "q1", expires))
    writer.run(("write", "a", "x", False, None))
    writer.run(("write", "b", "x", False, None))
    writer.run(("ask", "q2", 3600))
    first = writer.state.controls.approval("q1")
    assert first is not None and first.expired is (expires == 2)
    assert norm(folded(writer.log)) == norm(writer.state)
