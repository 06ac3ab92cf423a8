"""Every op over bare nats-py: schema-valid requests, mutations of them, and fixed hostile
payloads; each gets exactly one documented answer within 5 s, the services stay up, and
``quill verify`` passes on every workspace touched."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from contracts.ops import OPS
from tests.contract.conftest import (
    ANSWER_S,
    LEDGER,
    TENANT,
    Bus,
    Failure,
    LoopDriver,
    alive,
    all_ops,
    answer_of,
    examples,
    judge,
    op_workspace,
    seed,
    verify_all,
)
from tests.contract.strategies import (
    EXAMPLE_CASES,
    FIXED,
    STRATEGIES,
    UNKNOWN_RUN,
    Case,
    from_example,
)
from tests.up import Up

TOUCHED: set[str] = set()
EXAMPLES = examples(8)
CROWD = 8
"""Legitimate writes sent beside each hostile request."""
REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
"""Examples per op in CI (derandomized); QUILL_HYPOTHESIS=explore searches many more."""


class Driver(LoopDriver):
    """A bare nats-py client on its own event loop, seeding each op's workspace."""

    def __init__(self, up: Up) -> None:
        super().__init__(up)
        self.seeded: set[str] = set()

    def workspace(self, key: str) -> str:
        name = op_workspace("bus", key)
        if name not in self.seeded:
            self.run(seed(self.bus.nc, TENANT, name))
            self.seeded.add(name)
            TOUCHED.add(f"{TENANT}/{name}")
        return name


@pytest.fixture(scope="module")
def driver(up: Up) -> Iterator[Driver]:
    found = Driver(up)
    yield found
    found.close()


def subject(key: str, workspace: str) -> str:
    spec = OPS[key]
    return f"ws.{spec.kind}.{TENANT}.{workspace}.{spec.name}"


def check(key: str, case: Case, replies: list[bytes]) -> str | None:
    """The failure (if not a known one) of ``case`` sent to op ``key``."""
    sample = f"{case.show()} => {replies[0][:200]!r}" if replies else case.show()
    LEDGER.saw("bus", key, case.kind, answer_of(replies), sample)
    outcome = judge(OPS[key], replies) or outside_run(key, case, replies)
    if outcome is None:
        return None
    failure = Failure("bus", key, case.kind, outcome, case.show())
    return None if LEDGER.record(failure) else failure.line()


def outside_run(key: str, case: Case, replies: list[bytes]) -> str | None:
    """A query in a run that does not exist must not be answered (at any version)."""
    if OPS[key].kind != "qry" or case.headers.get("Ws-Run") != UNKNOWN_RUN:
        return None
    if json.loads(replies[0]).get("ok"):
        return "answered in an unknown run"
    return None


def still_alive(driver: Driver) -> None:
    dead = driver.run(alive(driver.bus.nc))
    assert not dead, f"services stopped answering pings: {dead}"


def all_at_once(driver: Driver, sends: list[tuple[str, str, Case]]) -> None:
    """Send every ``(op key, subject, case)`` at once; each is answered once, documented, and
    the services are alive afterwards."""

    async def send_all() -> list[list[bytes]]:
        return list(await asyncio.gather(*(driver.bus.send(s, c) for _, s, c in sends)))

    answers = driver.run(send_all())
    problems = [
        p
        for (key, _, case), got in zip(sends, answers, strict=True)
        if (p := check(key, case, got))
    ]
    still_alive(driver)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("name", sorted(FIXED))
def test_fixed_payload_to_every_op(driver: Driver, name: str) -> None:
    """One hostile payload sent to every op at once: each answered once, documented."""
    payload, headers = FIXED[name]
    case = Case(f"fixed:{name}", payload, headers)
    all_at_once(driver, [(k, subject(k, driver.workspace(k)), case) for k in all_ops()])


@pytest.mark.parametrize("name", EXAMPLE_CASES)
def test_documented_example_to_every_op(driver: Driver, name: str) -> None:
    """Each op's documented example, and the same outside the workspace, with NUL characters,
    and in an unknown run: each answered once, documented; a query in an unknown run is never
    answered (at whatever version the replica has)."""
    keys = all_ops()
    all_at_once(
        driver, [(k, subject(k, driver.workspace(k)), from_example(OPS[k], name)) for k in keys]
    )


@pytest.mark.parametrize("state", ["restricted", "locked"])
def test_every_op_on_a_restricted_or_locked_workspace(driver: Driver, state: str) -> None:
    """Each op's documented example on a restricted workspace, and on one another session has
    locked: each answered once with a code its op documents (no Ws-Wait: nothing waits)."""
    workspace = driver.workspace(state)
    setup: tuple[str, dict[str, Any], dict[str, str]] = (
        ("set_trust", {"trust": "restricted"}, {})
        if state == "restricted"
        else ("lock", {"ttl_ms": 600_000}, {"Ws-Session": "holder"})
    )
    op, body, headers = setup
    prepared = Case("setup", json.dumps(body).encode(), headers)
    got = driver.run(driver.bus.send(subject(f"cmd.{op}", workspace), prepared))
    assert got and json.loads(got[0])["ok"], got
    keys = [k for k in all_ops() if k not in ("cmd.create", "cmd.set_trust", "cmd.decide")]
    bodies = [
        {"command": "echo hi > out.txt"} if key == "exec.run" else from_example(OPS[key], "x").body
        for key in keys
    ]  # a command that runs and changes a file (the example's workdir does not exist)
    cases = [Case(f"fixed:{state}", json.dumps(body).encode()) for body in bodies]

    all_at_once(driver, [(k, subject(k, workspace), c) for k, c in zip(keys, cases, strict=True)])


@pytest.mark.parametrize("key", all_ops())
def test_fuzz_op(driver: Driver, key: str) -> None:
    """Valid and mutated requests of one op, one at a time."""
    workspace = driver.workspace(key)
    target = subject(key, workspace)

    @settings(max_examples=EXAMPLES, phases=(Phase.explicit, Phase.generate))
    @given(case=STRATEGIES[key])
    def one(case: Case) -> None:
        problem = check(key, case, driver.run(driver.bus.send(target, case)))
        assert problem is None, problem

    one()
    still_alive(driver)


@pytest.mark.parametrize("name", [*sorted(FIXED), "restore-outside"])
def test_hostile_beside_legitimate_writes(driver: Driver, name: str) -> None:
    """One client's hostile request, to every command of a workspace, never harms the others:
    legitimate writes sent at the same time to the same workspace all commit."""
    workspace = driver.workspace("crowd")
    if name == "restore-outside":  # once failed the whole group commit with INTERNAL
        hostile = from_example(OPS["cmd.restore"], "example-outside")
    else:
        payload, headers = FIXED[name]
        hostile = Case(f"fixed:{name}", payload, headers)
    writes = [
        Case(
            "valid",
            json.dumps({"path": f"crowd/{name}-{i}.txt", "content": f"{i}\n"}).encode(),
            {"Ws-Request-Id": f"crowd-{name}-{i}"},
        )
        for i in range(CROWD)
    ]
    commands = [key for key in all_ops() if OPS[key].kind == "cmd"]

    async def send_all() -> tuple[list[list[bytes]], list[list[bytes]]]:
        mine = [driver.bus.send(subject("cmd.write", workspace), w) for w in writes]
        theirs = [driver.bus.send(subject(key, workspace), hostile) for key in commands]
        answers = await asyncio.gather(*mine, *theirs)
        return list(answers[:CROWD]), list(answers[CROWD:])

    legit, bad = driver.run(send_all())
    problems = [
        p for key, got in zip(commands, bad, strict=True) if (p := check(key, hostile, got))
    ]
    for case, got in zip(writes, legit, strict=True):
        reply = json.loads(got[0]) if got and got[0] else None
        if not (reply and reply["ok"]):
            problems.append(
                f"a legitimate write beside fixed:{name} failed: {case.show()} -> {got}"
            )
    still_alive(driver)
    assert not problems, "\n".join(problems)


async def audit_records(bus: Bus) -> list[dict[str, Any]]:
    """Every audit record of the fuzzed tenant so far (``WS_AUDIT``)."""
    js = bus.nc.jetstream()
    sub = await js.pull_subscribe(f"ws.audit.{TENANT}.>", stream="WS_AUDIT")
    records: list[dict[str, Any]] = []
    try:
        while True:
            info = await sub.consumer_info()
            if not info.num_pending:
                break
            for msg in await sub.fetch(min(info.num_pending, 1000), timeout=ANSWER_S):
                records.append(json.loads(msg.data))
                await msg.ack()
    finally:
        await sub.unsubscribe()
    return records


def test_audit_request_ids(driver: Driver) -> None:
    """Every audit record names its request with a documented request id (a request sent
    without ``Ws-Request-Id`` gets one from the service, never ``bytearray(b'...')``)."""
    records = driver.run(audit_records(driver.bus))
    assert records
    bad = [
        (r["op"], r["request_id"])
        for r in records
        if r["request_id"] and not REQUEST_ID.fullmatch(r["request_id"])
    ]
    assert not bad, f"audit records with malformed request ids: {bad[:5]} ({len(bad)} in all)"


HOSTILE_SUBJECTS = (
    "ws.cmd.fuzz.bus-crowd.no_such_op",
    "ws.qry.fuzz.bus-crowd.no_such_op",
    "ws.exec.fuzz.bus-crowd.no_such_op",
    "ws.cmd.FUZZ.bus-crowd.write",
    "ws.qry.fuzz.Bus_Crowd.read",
    "ws.exec.-fuzz.bus-crowd.run",
    "ws.cmd.fuzz.never-created.write",
    "ws.qry.fuzz.never-created.read",
    "ws.exec.fuzz.never-created.run",
    "ws.cmd.fuzz.bus-crowd.Write",
    "ws.qry.fuzz.bus-crowd.read.extra",
    "ws.cmd." + "t" * 65 + ".w.write",
)
SUBJECT_CODES = ("INVALID_ARGUMENT", "WORKSPACE_NOT_FOUND")


@pytest.mark.parametrize("target", HOSTILE_SUBJECTS)
def test_hostile_subjects(driver: Driver, target: str) -> None:
    """A request to an op that does not exist, a malformed tenant or workspace id, or a
    workspace never created: one answer, INVALID_ARGUMENT or WORKSPACE_NOT_FOUND (or nobody
    subscribes to the subject at all: NATS answers "no responders" at once)."""
    driver.workspace("crowd")
    body = {"path": "a.txt", "content": "x", "command": "true"}
    if target.endswith(".read"):
        body = {"path": "a.txt"}
    case = Case("subject", json.dumps(body).encode(), {})
    got = driver.run(driver.bus.send(target, case))
    assert len(got) == 1, f"{target}: {len(got)} answers within {ANSWER_S:g} s"
    if got[0]:
        reply = json.loads(got[0])
        code = None if reply["ok"] else reply["error"]["code"]
        LEDGER.saw("bus", target, "subject", str(code or "ok"), target)
        if code not in SUBJECT_CODES:
            failure = Failure(
                "bus",
                target,
                "subject",
                f"answered {code or 'ok'}",
                got[0][:200].decode("utf-8", "replace"),
            )
            assert LEDGER.record(failure), failure.line()


MIX = 16
"""Requests of a concurrent mix."""


def test_concurrent_mix(driver: Driver) -> None:
    """Valid and mutated requests of every op, many clients at once on one workspace: each
    answered once, documented (one request's failure is nobody else's)."""
    workspace = driver.workspace("mix")
    keys = all_ops()
    pairs = st.sampled_from(keys).flatmap(lambda k: STRATEGIES[k].map(lambda c: (k, c)))

    @settings(max_examples=examples(4), phases=(Phase.explicit, Phase.generate))
    @given(batch=st.lists(pairs, min_size=MIX, max_size=MIX))
    def one(batch: list[tuple[str, Case]]) -> None:
        async def send_all() -> list[list[bytes]]:
            sends = (driver.bus.send(subject(k, workspace), c) for k, c in batch)
            return list(await asyncio.gather(*sends))

        answers = driver.run(send_all())
        problems = [
            p for (k, c), got in zip(batch, answers, strict=True) if (p := check(k, c, got))
        ]
        assert not problems, "\n".join(problems)

    one()
    still_alive(driver)


def test_each_request_answered_once(driver: Driver) -> None:
    """After every batch (and pings that went through the same services): no second answer."""
    still_alive(driver)
    twice = {token: len(a) for token, a in driver.bus.answers.items() if len(a) > 1}
    assert not twice, f"requests answered more than once: {twice}"


def test_verify_touched_workspaces(driver: Driver) -> None:
    """``quill verify`` passes on every workspace the fuzzing touched."""
    driver.workspace("crowd")  # at least one, even when only this test was selected
    failed = verify_all(driver.up, TOUCHED)
    assert not failed, failed
    still_alive(driver)
