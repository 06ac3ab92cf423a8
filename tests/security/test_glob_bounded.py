"""A glob a client sends cannot make the reader read the whole tree for 100 answers (issue 29).

Before, every glob read every entry of the workspace and tested each against the default
exclusions and the pattern: ``**`` with ``max_results`` 100 on a tree of 20,000 files read
them all (9.6 times the rows of a 1,000-file tree; 76 times the time at 100,000 files). Now a
glob of the whole workspace walks its live entries newest first and stops once it has looked
at ``GLOB_COUNTED`` entries and found more than it returns; what a client varies (the
pattern's shape, no exclusions, its own, a kind) leaves it bounded. Counted, not timed: the
SQLite steps of both projections (tests/integration/test_rows_touched.py's ``Stack``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from quill.client import Quill, Workspace
from tests.integration.test_rows_touched import (  # noqa: F401  (fixtures)
    FACTOR,
    SLACK,
    Stack,
    client,
    indexed,
    stack,
    tree_workspace,
)

SMALL, LARGE = 1_000, 20_000


def globs(ws: Workspace) -> dict[str, Callable[[], Awaitable[object]]]:
    return {
        "**": lambda: ws.glob("**", max_results=100),
        "** without exclusions": lambda: ws.glob("**", max_results=100, exclude=[]),
        "** with exclusions of its own": lambda: ws.glob(
            "**", max_results=100, exclude=["**/none/**", "*.txt", "{a,b}/**"]
        ),
        "**/**/* (files)": lambda: ws.glob("**/**/*", max_results=100, kind="file"),
        "{**/*.py,**}": lambda: ws.glob("{**/*.py,**}", max_results=100),
    }


@pytest.mark.timeout(300)
async def test_a_glob_of_everything_stops_at_what_it_returns(
    stack: Stack,  # noqa: F811 (a fixture)
    client: Quill,  # noqa: F811 (a fixture)
) -> None:
    trees = [await tree_workspace(client, n) for n in (SMALL, LARGE)]
    await indexed(stack)
    counts: dict[str, list[int]] = {}
    for ws in trees:
        for name, op in globs(ws).items():
            counts.setdefault(name, []).append(await stack.steps(ws, op))
        answer = await ws.glob("**", max_results=100)
        assert len(answer.entries) == 100 and answer.truncated
    print("\n".join(f"{name:<36}{a:>10}{b:>10}" for name, (a, b) in counts.items()))
    over = [name for name, (a, b) in counts.items() if b > FACTOR * a + SLACK]
    assert not over, counts
    assert not stack.explained(), stack.explained()
