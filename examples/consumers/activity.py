"""The per-tenant activity table both consumers keep, in SQLite, and how each message is
counted once although JetStream may deliver it more than once.

``activity`` has one row per tenant: ``operations`` (audit records: every request, reads and
failures included), ``failures`` (those whose outcome is not ``ok``), ``versions`` (events of
its workspaces' logs: each is one version) and ``paths`` (changes those events made), and the
time of the latest.

JetStream delivers at least once: a message whose ack was lost (the consumer killed between
its work and its ack, NATS restarted) comes again. So each message's identity goes into
``seen`` in the same transaction as its count (as an event-sourced projection keeps its
tracking row with its state): a message delivered again finds its identity there and is
acknowledged without being counted. The table counts each message exactly once, as long as
the database file survives with the consumer's durable name.
"""

from __future__ import annotations

import sqlite3
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS activity (
    tenant TEXT PRIMARY KEY,
    operations INTEGER NOT NULL DEFAULT 0,
    failures INTEGER NOT NULL DEFAULT 0,
    versions INTEGER NOT NULL DEFAULT 0,
    paths INTEGER NOT NULL DEFAULT 0,
    last_at TEXT
);
CREATE TABLE IF NOT EXISTS seen (id TEXT PRIMARY KEY);
"""


def audit_id(metadata: Any) -> str:
    """An audit record's identity: its place in ``WS_AUDIT`` (stream sequence) and the time
    the stream stored it. The time is there because ``WS_AUDIT`` on one server is written
    asynchronously (``persist_mode: async``): a server killed with ``kill -9`` may lose its
    last records, and then gives their sequence numbers to new ones."""
    return f"{metadata.stream}:{metadata.sequence.stream}:{metadata.timestamp.isoformat()}"


def event_id(headers: dict[str, str] | None) -> str:
    """An event's identity: its hash (header ``Ws-Event-Hash``; a workspace purged and made
    again starts at version 1 again, so the version alone would not do)."""
    return "event:" + (headers or {})["Ws-Event-Hash"]


class Activity:
    def __init__(self, path: str) -> None:
        self.db = sqlite3.connect(path)
        self.db.executescript(SCHEMA)

    def count(self, key: str, tenant: str, at: str, **added: int) -> bool:
        """Add ``added`` (``operations=1``...) to ``tenant``'s row, unless ``key`` was
        counted already; both or neither. Whether it counted."""
        with self.db:  # one transaction: committed on the way out, rolled back on an error
            fresh = self.db.execute("INSERT OR IGNORE INTO seen VALUES (?)", (key,)).rowcount
            if fresh:
                self.db.execute("INSERT OR IGNORE INTO activity (tenant) VALUES (?)", (tenant,))
                columns = "".join(f"{name} = {name} + :{name}, " for name in added)
                self.db.execute(
                    f"UPDATE activity SET {columns}last_at = max(coalesce(last_at, ''), :at) "
                    "WHERE tenant = :tenant",
                    {**added, "at": at, "tenant": tenant},
                )
        return bool(fresh)

    def audited(self, key: str, record: dict[str, Any]) -> bool:
        """An audit record (docs/schemas/audit_record.json)."""
        failed = int(record["outcome"] != "ok")
        return self.count(key, record["tenant"], record["at"], operations=1, failures=failed)

    def committed(self, key: str, event: dict[str, Any]) -> bool:
        """An event of a workspace's log (docs/schemas/event.json)."""
        changes = len(event.get("changes", []))
        return self.count(key, event["tenant"], event["at"], versions=1, paths=changes)
