"""Control events (locks, trust, archive, runs, approvals) as the reader finds them
(see ``infra.sql``)."""

from __future__ import annotations

from typing import Any

from infra.sql.schema import WHOLE_WORKSPACE

NEWEST_OF_KIND = (
    "SELECT max(version) AS v FROM controls INDEXED BY controls_kind WHERE ws=? AND type=?"
)
LAST_CONTROL = "SELECT event FROM controls WHERE ws=? AND version=(SELECT max(v) FROM ({newest}))"
"""The last control event of some kinds: one seek of ``controls_kind`` a kind."""
PINNED = (
    "SELECT json_extract(event, '$.pinned_version') FROM controls INDEXED BY controls_run "
    "WHERE ws=? AND type='run_started' AND json_extract(event, '$.run_id')=?"
)
"""The version a run reads: one seek of ``controls_run``, however many runs there were."""
CONTROL_EVENTS = (
    f"SELECT {WHOLE_WORKSPACE} event FROM controls INDEXED BY controls_kind "
    "WHERE ws=? AND type IN ({marks}) ORDER BY version"
)
"""Every control event of some kinds (a run's, the attached workspaces', the approvals'
answers fold them all)."""


def last_control(ws: int, kinds: tuple[str, ...]) -> tuple[str, list[Any]]:
    """``LAST_CONTROL`` of ``kinds``."""
    newest = " UNION ALL ".join([NEWEST_OF_KIND] * len(kinds))
    return LAST_CONTROL.format(newest=newest), [ws, *[x for kind in kinds for x in (ws, kind)]]
