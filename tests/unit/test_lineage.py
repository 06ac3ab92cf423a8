"""Where two workspaces' histories meet (``core.lineage``): a fork and its source, a fork's
fork and its grandparent, two forks of one source, a fork read below its fork point, and
two workspaces that share nothing."""

from __future__ import annotations

from core.lineage import chain, common

ONE = (("src", 10),)
"""``one``: forked from ``src`` at 10."""
TWO = (("one", 15), ("src", 10))
"""``two``: forked from ``one`` at 15."""
THREE = (("src", 20),)
"""``three``: forked from ``src`` at 20."""


def test_a_chain_is_its_layers_as_of_its_version() -> None:
    assert chain("two", 30, TWO) == [("two", 30), ("one", 15), ("src", 10)]
    assert chain("two", 12, TWO) == [("two", 12), ("one", 12), ("src", 10)]
    assert chain("two", 4, TWO) == [("two", 4), ("one", 4), ("src", 4)]
    assert chain("src", 7, ()) == [("src", 7)]


def test_histories_meet_at_the_older_version_of_the_nearest_shared_workspace() -> None:
    src = chain("src", 25, ())
    assert common(chain("one", 30, ONE), src) == 10  # a fork and its source
    assert common(src, chain("one", 30, ONE)) == 10
    assert common(chain("one", 30, ONE), chain("src", 6, ())) == 6  # the source before it
    assert common(chain("one", 8, ONE), src) == 8  # the fork before its fork point
    assert common(chain("two", 40, TWO), src) == 10  # a fork's fork and its grandparent
    assert common(chain("two", 40, TWO), chain("one", 30, ONE)) == 15  # and its source
    assert common(chain("two", 40, TWO), chain("one", 12, ONE)) == 12
    assert common(chain("one", 30, ONE), chain("three", 30, THREE)) == 10  # two forks of src
    assert common(chain("two", 40, TWO), chain("three", 30, THREE)) == 10
    assert common(chain("three", 18, THREE), chain("one", 30, ONE)) == 10
    assert common(chain("one", 30, ONE), chain("one", 22, ONE)) == 22  # itself


def test_unrelated_workspaces_share_nothing() -> None:
    assert common(chain("one", 30, ONE), chain("other", 30, ())) is None
    assert common(chain("lone", 3, ()), chain("other", 3, (("base", 2),))) is None
