"""The executor's side of egress (``infra.exec.egress``): which command gets a proxy, and one
audit record and metric per connection through it.

A command of a workspace the operator's ``--egress-allow`` names gets a ``Grant``
(``Spawn.egress``); each of its connections, allowed or refused, is audited as an
``exec.egress`` record of the workspace, with the command's origin (actor, session, request id:
the command it came from) and, in ``details``, host, port, address, bytes each way, verdict and
reason; it is counted in ``quill_executor_egress_connections_total{verdict}`` and its bytes in
``quill_executor_egress_bytes_total{direction}``, never as a request.
"""

from __future__ import annotations

from pathlib import Path

from contracts.subjects import Address, Origin
from infra.exec.egress import Connection, Gate, Grant, Rules
from infra.metrics import EXECUTOR_EGRESS, EXECUTOR_EGRESS_BYTES
from infra.runtime import Auditor
from services.executor.config import ExecutorConfig

VERDICTS = {v: EXECUTOR_EGRESS.labels(v) for v in ("allowed", "refused", "failed")}
SENT, RECEIVED = EXECUTOR_EGRESS_BYTES.labels("sent"), EXECUTOR_EGRESS_BYTES.labels("received")


class Egress:
    """The executor's egress gate and its auditor."""

    def __init__(self, gate: Gate, auditor: Auditor) -> None:
        self.gate, self.auditor = gate, auditor

    @classmethod
    def of(cls, config: ExecutorConfig, data: Path, auditor: Auditor) -> Egress | None:
        """The egress ``config`` asks for (sockets under ``data``); None: none allowed.

        Raises:
            ValueError: a malformed ``egress_allow`` entry, or ``data`` too deep for a socket.
        """
        rules = Rules.parse(config.egress_allow)
        if not rules:
            return None
        return cls(Gate(rules, data / "egress", config.egress_policy), auditor)

    def grant(self, address: Address, origin: Origin) -> Grant | None:
        """The proxy a command sent to ``address`` by ``origin`` may use; None: no network."""
        where = Address("exec", address.tenant, address.workspace, "egress")

        async def audit(conn: Connection) -> None:
            VERDICTS[conn.verdict].inc()
            SENT.inc(conn.sent)
            RECEIVED.inc(conn.received)
            summary = f"egress {conn.method or '?'} {conn.host or '?'}:{conn.port}: {conn.verdict}"
            details = {
                "host": conn.host,
                "port": conn.port,
                "method": conn.method,
                "address": conn.address,
                "sent_bytes": conn.sent,
                "received_bytes": conn.received,
                "verdict": conn.verdict,
                "reason": conn.reason,
                "command_id": origin.request_id,
            }
            await self.auditor.record(
                where, origin, conn.started, summary=summary, details=details, counted=False
            )

        return self.gate.grant(address.tenant, address.workspace, audit)
