"""What the property tests that start a real writer share: their hypothesis settings and the
log a real writer appended (``test_evolve_property.py``, ``test_fork_property.py``,
``test_fork_pages.py``). Kept out of ``tests/core``, whose tests load nothing of the server."""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from nats.aio.client import Client as NATS

from contracts.subjects import Subjects
from core.plan import Committed
from infra import log as eventlog

REAL_WRITER = settings(
    max_examples=4,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
"""A property whose every example starts a real writer (and reader) on the test's
nats-server: a few examples, no deadline (one takes seconds), the function-scoped fixtures
(the server, ``tmp_path``) shared by its examples (each on a data directory of its own)."""


async def log_of(nc: NATS, tenant: str, name: str) -> list[Committed]:
    """The whole log of ``tenant/name``, as its writer appended it."""
    js, subject = nc.jetstream(), Subjects().evt(tenant, name)
    return await eventlog.read(js, subject, 0, await eventlog.last_seq(js, subject))
