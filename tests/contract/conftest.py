"""The contract fuzzing suite's stack and checks.

A ``quill up`` (a real process: nats-server, writer, reader, executor, gateway: the ``up``
fixture) for each module; requests go to it from outside the SDK (bare nats-py, the official
MCP client, httpx).

Every request must get exactly one answer within ``ANSWER_S`` carrying a documented error code
(one of the op's errors in ``contracts/ops.py``), never ``INTERNAL``, and the reply must match the
op's published reply schema. A failure fails the test, unless it is one of ``KNOWN``: a bug of
issue 11 that is being fixed, tolerated by op, mutation kind and outcome only; every tolerated
failure, and every ``KNOWN`` entry that did not occur, is printed at the end of the run.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import fnmatch
import json
import os
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import jsonschema  # type: ignore[import-untyped]
import nats
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from contracts.errors import ErrorCode
from contracts.ops import OPS, OpSpec
from tests.contract.strategies import SEEDED_DIRS, SEEDED_FILES, Case, reply_schema
from tests.up import Up

ANSWER_S = 5.0
"""Every request is answered within this (the contract's promise to any client)."""
SERVICES = ("writer", "reader", "executor", "gateway")
TENANT = "fuzz"

EXPLORE = os.environ.get("QUILL_HYPOTHESIS") == "explore"


def examples(ci: int) -> int:
    """Examples per test: ``ci`` fixed ones in CI (the suite stays fast), 25 times as many fresh
    ones with ``QUILL_HYPOTHESIS=explore``."""
    return ci * 25 if EXPLORE else ci


KNOWN: dict[tuple[str, str, str], str] = {}
"""Failures being fixed elsewhere: (op glob, case-kind glob, outcome glob) -> why.
Only a failure matching one entry is tolerated; remove an entry as soon as its fix lands."""


@dataclass
class Failure:
    transport: str
    op: str
    kind: str
    outcome: str
    example: str

    def line(self) -> str:
        return f"[{self.transport}] {self.op} {self.kind}: {self.outcome}\n      {self.example}"


@dataclass
class Ledger:
    """Every failure seen in this run, and which ``KNOWN`` entries they matched."""

    tolerated: list[tuple[Failure, tuple[str, str, str]]] = field(default_factory=list)
    unexpected: list[Failure] = field(default_factory=list)
    answers: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    """(transport, case kind, answer: ``ok`` or the error code) -> how many."""

    samples: dict[tuple[str, str, str], str] = field(default_factory=dict)

    def saw(self, transport: str, op: str, kind: str, answer: str, sample: str) -> None:
        key = (transport, kind.split(":", 1)[0], answer)
        self.answers[key] += 1
        self.samples.setdefault((transport, f"{op} {kind}", answer), sample[:300])

    def known(self, failure: Failure) -> tuple[str, str, str] | None:
        for entry in KNOWN:
            op, kind, outcome = entry
            if (
                fnmatch.fnmatchcase(failure.op, op)
                and fnmatch.fnmatchcase(failure.kind, kind)
                and fnmatch.fnmatchcase(failure.outcome, outcome)
            ):
                return entry
        return None

    def record(self, failure: Failure) -> bool:
        """True when the failure is tolerated (one of ``KNOWN``)."""
        entry = self.known(failure)
        if entry is None:
            self.unexpected.append(failure)
            return False
        self.tolerated.append((failure, entry))
        return True


LEDGER = Ledger()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    write = terminalreporter.write_line
    if os.environ.get("QUILL_FUZZ_STATS") and LEDGER.answers:
        terminalreporter.section("contract fuzzing: answers by transport, case kind, outcome")
        for (transport, kind, answer), n in sorted(LEDGER.answers.items()):
            write(f"{transport:5} {kind:16} {answer:24} {n}")
        if os.environ["QUILL_FUZZ_STATS"] == "samples":
            for (transport, kind, answer), sample in sorted(LEDGER.samples.items()):
                write(f"{transport} {kind} -> {answer}: {sample}")
    if not (LEDGER.tolerated or LEDGER.unexpected or LEDGER.answers):
        return  # the contract suite did not run
    terminalreporter.section("contract fuzzing: known failures")
    if not (KNOWN or LEDGER.unexpected):
        write(f"none: {sum(LEDGER.answers.values())} answers, each as the contract says")
    seen: dict[tuple[str, str, str], list[Failure]] = {}
    for failure, entry in LEDGER.tolerated:
        seen.setdefault(entry, []).append(failure)
    for entry, failures in seen.items():
        write(f"KNOWN {entry}: {KNOWN[entry]} -- {len(failures)} time(s), e.g.")
        write("    " + failures[0].line())
    for entry, why in KNOWN.items():
        if entry not in seen:
            write(f"KNOWN {entry} did not occur in this run (fixed? then remove it): {why}")
    for failure in LEDGER.unexpected:
        write("UNEXPECTED " + failure.line())


def answer_of(replies: list[bytes]) -> str:
    """``ok``, the error code, or what else came (for the statistics)."""
    try:
        reply = json.loads(replies[0])
        return "ok" if reply["ok"] else str(reply["error"]["code"])
    except Exception:
        return "no reply" if not replies else "garbage"


def judge(spec: OpSpec, replies: list[bytes]) -> str | None:
    """What is wrong with the answers ``replies`` to one request of ``spec`` (None: nothing)."""
    if not replies:
        return f"no reply within {ANSWER_S:g} s"
    if len(replies) > 1:
        return f"{len(replies)} replies"
    raw = replies[0]
    if not raw:
        return "no responders"
    try:
        reply = json.loads(raw)
    except ValueError:
        return f"reply is not JSON: {raw[:80]!r}"
    if not isinstance(reply, dict) or not isinstance(reply.get("ok"), bool):
        return f"reply is not an envelope: {raw[:80]!r}"
    if not reply["ok"]:
        return judge_code(spec, reply.get("error", {}).get("code"), str(reply.get("error")))
    errors = sorted(
        jsonschema.Draft202012Validator(reply_schema(spec.key)).iter_errors(reply),
        key=lambda e: list(e.path),
    )
    if errors:
        where = "/".join(str(p) for p in errors[0].path)
        return f"reply does not match its schema at {where}: {errors[0].message[:120]}"
    return judge_changes(spec, reply)


def judge_changes(spec: OpSpec, reply: dict[str, Any]) -> str | None:
    """A command that ran keeps what it changed: ``changes.error`` may only be a documented
    refusal (a limit), never ``INTERNAL`` nor a malformed request of the executor's own."""
    changes = (reply.get("result") or {}).get("changes") if spec.kind == "exec" else None
    error = (changes or {}).get("error")
    if not error:
        return None
    code = error.split(":", 1)[0]
    if code in (ErrorCode.INTERNAL, ErrorCode.INVALID_ARGUMENT) or code not in spec.errors:
        return f"changes lost: {code} ({error[:160]})"
    return None


def judge_code(spec: OpSpec, code: Any, text: str) -> str | None:
    if code == ErrorCode.INTERNAL:
        return f"INTERNAL ({text[:160]})"
    if code not in ErrorCode.__members__:
        return f"unknown code {code!r} ({text[:160]})"
    if code not in spec.errors:
        return f"undocumented {code} ({text[:160]})"
    return None


def outcome_class(outcome: str) -> str:
    """The stable part of an outcome (the text in parentheses varies with the example)."""
    return outcome.split(" (", 1)[0]


# -- the stack: the ``up`` fixture (tests/conftest.py), one ``quill up`` per module ----------


class Bus:
    """A bare nats-py client that counts every answer to every request it sent."""

    def __init__(self, nc: NATS) -> None:
        self.nc = nc
        self.prefix = nc.new_inbox()
        self.answers: dict[str, list[bytes]] = {}
        self.arrived: dict[str, asyncio.Event] = {}
        self.sent = 0
        self.sub: Any = None

    async def start(self) -> Bus:
        async def collect(msg: Msg) -> None:
            token = msg.subject.rsplit(".", 1)[-1]
            self.answers.setdefault(token, []).append(msg.data)
            self.arrived.setdefault(token, asyncio.Event()).set()

        self.sub = await self.nc.subscribe(self.prefix + ".*", cb=collect)
        return self

    async def send(self, subject: str, case: Case) -> list[bytes]:
        """Send ``case``, wait (at most ``ANSWER_S``) for its first answer; the list keeps
        growing if more come (``duplicates`` checks at the end of a batch)."""
        self.sent += 1
        token = str(self.sent)
        event = self.arrived.setdefault(token, asyncio.Event())
        answers = self.answers.setdefault(token, [])
        await self.nc.publish(
            subject, case.payload, reply=f"{self.prefix}.{token}", headers=case.headers or None
        )
        try:
            async with asyncio.timeout(ANSWER_S):
                await event.wait()
        except TimeoutError:
            pass
        return answers

    async def close(self) -> None:
        await self.nc.close()


async def connect(up: Up) -> Bus:
    return await Bus(await nats.connect(up.nats_url)).start()


T = TypeVar("T")


class LoopDriver:
    """A ``Bus`` to ``up`` on an event loop of its own, for the synchronous Hypothesis tests
    (``run``: a coroutine to its end on that loop); ``close`` closes both."""

    def __init__(self, up: Up) -> None:
        self.up = up
        self.loop = asyncio.new_event_loop()
        self.bus: Bus = self.run(connect(up))

    def run(self, coro: Coroutine[Any, Any, T] | asyncio.Future[T]) -> T:
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        self.run(self.bus.close())
        self.loop.close()


async def alive(nc: NATS) -> list[str]:
    """The services that do not answer a ping (within ``ANSWER_S``)."""
    dead = []
    for service in SERVICES:
        try:
            msg = await nc.request(f"ws.sys.ping.{service}", b"", timeout=ANSWER_S)
            if not msg.data:
                dead.append(service)
        except Exception:
            dead.append(service)
    return dead


async def seed(nc: NATS, tenant: str, workspace: str) -> None:
    """Create ``tenant/workspace`` with ``SEEDED_FILES`` and ``SEEDED_DIRS`` (idempotent)."""

    async def cmd(op: str, body: dict[str, Any]) -> dict[str, Any]:
        msg = await nc.request(
            f"ws.cmd.{tenant}.{workspace}.{op}", json.dumps(body).encode(), timeout=10
        )
        return dict(json.loads(msg.data))

    created = await cmd("create", {"exist_ok": True})
    assert created["ok"], created
    changes: list[dict[str, Any]] = [{"type": "mkdir", "path": d} for d in SEEDED_DIRS]
    for path in SEEDED_FILES:
        if path.endswith(".dat"):
            changes.append({"type": "put", "path": path, "data": "AP8AgA=="})
        else:
            changes.append({"type": "put", "path": path, "content": f"{path}\nline 2\nhello\n"})
    info = await nc.request(f"ws.qry.{tenant}.{workspace}.info", b"{}", timeout=10)
    version = json.loads(info.data)["version"]
    if version == 1:
        applied = await cmd("apply", {"base_version": 1, "changes": changes})
        assert applied["ok"], applied


def verify_all(up: Up, workspaces: set[str]) -> dict[str, str]:
    """``quill verify`` on each workspace (concurrently): the failures' outputs, by workspace."""

    def one(ws: str) -> tuple[str, str | None]:
        result = up.cli("verify", ws, check=False)
        return ws, None if result.returncode == 0 else result.stdout + result.stderr

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        return {ws: out for ws, out in pool.map(one, sorted(workspaces)) if out is not None}


def op_workspace(transport: str, key: str) -> str:
    """The workspace one op is fuzzed in over one transport (ops do not disturb each other)."""
    return f"{transport}-{key.replace('.', '-').replace('_', '-')}"


def all_ops() -> list[str]:
    return sorted(OPS)


def data_dir(up: Up) -> Path:
    return up.data
