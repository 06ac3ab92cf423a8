"""The examples of ``docs/contract.md``: every op's example request, run in order against a
fresh stack, with the reply it got. ``record`` writes ``docs/examples.json``; the docs test
runs them again and compares (ignoring times and event hashes)."""

from __future__ import annotations

import json
import re
import tempfile
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from contracts import ops
from contracts.subjects import TENANT_SCOPE, Subjects
from infra import bus
from infra.runtime import Settings, start_service
from quill_cli.natsserver import NatsServer
from services.executor.app import ExecutorConfig, start_executor
from services.reader.app import Reader
from services.writer.app import Writer

TENANT, WORKSPACE = "acme", "demo"
_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")
_HASH_KEYS = {"hash", "prev_hash", "last_hash"}
_VARYING = {"duration_ms"}
_SHELL_ID = re.compile(r"^s[0-9a-f]{12}[A-Za-z0-9]{1,40}$")


def mask(value: Any, key: str = "") -> Any:
    """Replace what legitimately differs between runs (times, event hashes, durations, the
    ids of shells opened)."""
    if isinstance(value, dict):
        return {k: mask(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [mask(v, key) for v in value]
    if isinstance(value, str) and _TIME.match(value):
        return "<time>"
    if key in _HASH_KEYS and isinstance(value, str):
        return "<hash>"
    if key in _VARYING:
        return "<varies>"
    if key == "shell" and isinstance(value, str) and _SHELL_ID.match(value):
        return "<shell id>"  # made at random by the executor that opened it
    return value


async def run_examples(nats_url: str) -> dict[str, Any]:
    """Run every example in the op table, in order, on a new workspace."""
    nc = await bus.connect(nats_url, "examples")
    subjects = Subjects()
    out: dict[str, Any] = {}
    last = 0  # the version the last command produced: queries read their writes
    try:
        for spec in ops.OPS.values():
            where = TENANT_SCOPE if spec.scope == "tenant" else WORKSPACE
            subject = subjects.request(spec.kind, TENANT, where, spec.name)
            body = dict(spec.example)
            headers = {
                "Ws-Actor": "docs",
                "Ws-Session": "docs-session",
                "Ws-Request-Id": f"example-{spec.name}",
            }
            if spec.kind in ("qry", "exec") and "min_version" in spec.request.__struct_fields__:
                body.setdefault("min_version", last)
            if spec.kind == "qry":
                headers.pop("Ws-Request-Id")
            msg = await nc.request(subject, json.dumps(body).encode(), timeout=10, headers=headers)
            reply = json.loads(msg.data)
            if spec.kind in ("cmd", "exec"):
                last = max(last, reply.get("version") or 0)
            out[spec.key] = {"request": body, "reply": reply}
    finally:
        await nc.close()
    return out


async def with_stack(fn: Any) -> Any:
    """Run ``fn(nats_url)`` against a throw-away server, writer, reader and executor."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        server = NatsServer(root / "nats").start()
        try:
            settings = Settings(nats_url=server.url, data_dir=root)
            async with AsyncExitStack() as stack:
                writer = await start_service(settings, "writer", Writer)
                stack.push_async_callback(writer.stop)
                reader = await start_service(settings, "reader", Reader, Reader.prepare)
                stack.push_async_callback(reader.stop)
                executor = await start_executor(settings, ExecutorConfig())
                stack.push_async_callback(executor.stop)
                return await fn(server.url)
        finally:
            server.stop()


async def record(path: Path) -> None:
    examples = await with_stack(run_examples)
    path.write_text(json.dumps(examples, indent=2) + "\n")
