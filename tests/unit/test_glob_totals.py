"""A glob's total that is a lower bound is told as one (``Matches.total_exact``)."""

from __future__ import annotations

from datetime import UTC, datetime

from contracts import replies as rp
from services.gateway.mcp import texts


def matches(total: int, exact: bool) -> rp.Matches:
    at = datetime(2025, 1, 1, tzinfo=UTC)
    entry = rp.Entry(
        name="a.py", path="a.py", kind="file", size=1, modified=at, file_version=1, etag=None
    )
    return rp.Matches(
        path="/", pattern="**", entries=[entry], total=total, truncated=True, total_exact=exact
    )


def test_the_gateway_says_at_least_when_the_glob_stopped() -> None:
    stopped = texts.matches_text("**", "/", matches(1001, exact=False))
    assert stopped.startswith("Found at least 1001 match(es) for '**':")
    assert "(showing 1 of at least 1001:" in stopped
    counted = texts.matches_text("**", "/", matches(7, exact=True))
    assert counted.startswith("Found 7 match(es) for '**':") and "(showing 1 of 7:" in counted
