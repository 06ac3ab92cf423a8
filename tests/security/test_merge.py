"""Merges as an attacker (or an unlucky crowd) tries them (issue 33), through ``quill up`` with
tenants and bare nats-py clients holding each tenant's credentials: a merge stays within the
tenant of its subject, a merge of an unrelated workspace has no base, concurrent merges into
one target are decided one after the other (the second on the first's result), a merge
racing writes to either side takes a consistent version of each, a result over the
target's limits commits nothing, and content merged in passes the target's secret rules as
they are when it merges (a secret registered after the fork's content was written)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import nats.errors
import pytest
from nats.aio.client import Client

from contracts.errors import ErrorCode
from tests.bare import answer, code, ok
from tests.up import TENANTS, Up, bare, running

pytestmark = pytest.mark.up(tenants=TENANTS)

TEXT = "".join(f"line {i}\n" for i in range(1, 11))


async def forked(nc: Client, tenant: str, main: str, *forks: str) -> None:
    await ok(nc, f"ws.cmd.{tenant}.{main}.create", {})
    await ok(nc, f"ws.cmd.{tenant}.{main}.write", {"path": "t.txt", "content": TEXT})
    for name in forks:
        await ok(nc, f"ws.cmd.{tenant}.{name}.fork", {"from": main})


async def read(nc: Client, tenant: str, ws: str, path: str, version: int) -> str:
    answer = await ok(nc, f"ws.qry.{tenant}.{ws}.read", {"path": path, "version": version})
    return str(answer["result"]["content"])


async def test_a_merge_stays_within_its_tenant(up: Up) -> None:
    async with bare(up, "a") as na, bare(up, "b") as nb:
        await forked(na, "a", "private", "work")
        await ok(na, "ws.cmd.a.work.write", {"path": "secret.txt", "content": "a's own\n"})
        await forked(nb, "b", "mine")
        # b names a's workspace: looked up in b's tenant, where there is none
        unknown = await answer(nb, "ws.cmd.b.mine.merge", {"from": "work"})
        assert code(unknown) == "WORKSPACE_NOT_FOUND"
        for name in ("a/work", "../a/work", "a.work"):  # nor can it be named with its tenant
            named = await answer(nb, "ws.cmd.b.mine.merge", {"from": name})
            assert code(named) == ErrorCode.INVALID_ARGUMENT, name
        # a workspace of b's named like a's shares no history with b's: no base
        await ok(nb, "ws.cmd.b.work.create", {})
        assert code(await answer(nb, "ws.cmd.b.mine.merge", {"from": "work"})) == "NO_MERGE_BASE"
        # nor can b send on a's subjects (NATS refuses them: nobody answers)
        with pytest.raises(nats.errors.Error):
            await nb.request("ws.cmd.a.private.merge", b'{"from": "work"}', timeout=2)
        after = {"path": "after.txt", "content": "", "expected_version": 2}
        assert code(await answer(na, "ws.cmd.a.private.write", after)) is None  # nothing merged


async def test_concurrent_merges_are_decided_one_after_the_other(up: Up) -> None:
    async with bare(up, "a") as na:
        await forked(na, "a", "hub", "f1", "f2")
        lines = TEXT.splitlines(keepends=True)
        one = "".join(["first\n", *lines[1:]])
        two = "".join([*lines[:-1], "last\n"])
        await ok(na, "ws.cmd.a.f1.write", {"path": "t.txt", "content": one})
        await ok(na, "ws.cmd.a.f2.write", {"path": "t.txt", "content": two})
        merges = [answer(na, "ws.cmd.a.hub.merge", {"from": f}) for f in ("f1", "f2", "f1", "f2")]
        answers = await asyncio.gather(*merges)
        assert all(a["ok"] for a in answers), answers
        committed = sorted(a["version"] for a in answers if a["result"]["committed"])
        assert committed == [3, 4]  # each fork once; the repeat found nothing new
        text = await read(na, "a", "hub", "t.txt", 4)
        assert text == "".join(["first\n", *lines[1:-1], "last\n"])  # both, line by line


async def test_a_merge_racing_writes_takes_one_version_of_each_side(up: Up) -> None:
    async with bare(up, "a") as na:
        await forked(na, "a", "race", "rf")
        await ok(na, "ws.cmd.a.rf.write", {"path": "early.txt", "content": "early\n"})
        merge, fork_write, target_write = await asyncio.gather(
            answer(na, "ws.cmd.a.race.merge", {"from": "rf"}),
            answer(na, "ws.cmd.a.rf.write", {"path": "late.txt", "content": "late\n"}),
            answer(na, "ws.cmd.a.race.write", {"path": "t.txt", "content": "target's\n"}),
        )
        assert merge["ok"] and fork_write["ok"] and target_write["ok"]
        result = merge["result"]
        took_late = fork_write["version"] <= result["from_version"]
        paths = {c["path"] for c in result["changes"]}
        assert paths == ({"early.txt", "late.txt"} if took_late else {"early.txt"})
        latest = max(merge["version"], target_write["version"])
        assert await read(na, "a", "race", "t.txt", latest) == "target's\n"  # never undone
        # the next merge takes what the first did not, and nothing twice
        again = await ok(na, "ws.cmd.a.race.merge", {"from": "rf"})
        assert {c["path"] for c in again["result"]["changes"]} == (
            set() if took_late else {"late.txt"}
        )


async def test_a_merged_file_over_the_targets_limit_commits_nothing(up: Up) -> None:
    async with bare(up, "a") as na:
        body = "x" * 60 + "\n"
        await ok(na, "ws.cmd.a.small.create", {"limits": {"max_file_bytes": 100}})
        await ok(na, "ws.cmd.a.small.write", {"path": "t.txt", "content": body})
        await ok(na, "ws.cmd.a.sf.fork", {"from": "small"})
        await ok(na, "ws.cmd.a.sf.write", {"path": "t.txt", "content": "y" * 30 + "\n" + body})
        await ok(na, "ws.cmd.a.small.write", {"path": "t.txt", "content": body + "z" * 30 + "\n"})
        refused = await answer(na, "ws.cmd.a.small.merge", {"from": "sf"})
        assert code(refused) == ErrorCode.SIZE_LIMIT_EXCEEDED  # 123 bytes merged, 100 fit
        after = {"path": "after.txt", "content": "", "expected_version": 3}
        assert code(await answer(na, "ws.cmd.a.small.write", after)) is None  # nothing committed


SECRET = "sk-merge-0123456789abcdef"


async def test_merged_content_passes_the_targets_secret_rules(tmp_path: Path) -> None:
    """A fork's content written before a secret was registered is redacted when it merges
    (the rules as they are when the merge is decided, as a write's)."""
    data = tmp_path / "data"
    with running(data, "--sandbox", "local") as up:
        async with bare(up, None) as na:
            await forked(na, "acme", "vault", "vf")
            leak = {"path": "leak.txt", "content": f"token = {SECRET}\n"}
            await ok(na, "ws.cmd.acme.vf.write", leak)  # no secret registered yet
    with running(data, "--sandbox", "local", secrets=f'[secrets]\nmerge = "{SECRET}"\n') as up:
        async with bare(up, None) as na:
            merged = await ok(na, "ws.cmd.acme.vault.merge", {"from": "vf"})
            text = await read(na, "acme", "vault", "leak.txt", merged["version"])
            assert text == "token = [REDACTED:merge]\n"


async def test_a_merge_request_cannot_say_what_a_merge_kept(up: Up) -> None:
    """What a merge records of where it kept its own side (``merged_from.kept``, read by the
    merge back the other way) is the writer's, from the merged tree: a request naming it, or
    a base, is refused as a whole and commits nothing; a write cannot carry one either."""
    async with bare(up, "a") as na:
        await forked(na, "a", "src", "fk")
        await ok(na, "ws.cmd.a.fk.write", {"path": "own.txt", "content": "the fork's\n"})
        await ok(na, "ws.cmd.a.src.write", {"path": "t.txt", "content": TEXT + "more\n"})
        forged: list[dict[str, Any]] = [
            {"from": "src", "kept": []},
            {"from": "src", "merged_from": {"workspace": "src", "version": 1, "kept": []}},
            {"from": "src", "base_version": 3, "from_base": 3},
        ]
        for body in forged:
            refused = await answer(na, "ws.cmd.a.fk.merge", body)
            assert code(refused) == ErrorCode.INVALID_ARGUMENT, body
        write = {"path": "x.txt", "content": "", "merged_from": {"workspace": "src"}}
        assert code(await answer(na, "ws.cmd.a.fk.write", write)) == ErrorCode.INVALID_ARGUMENT
        merged = await ok(na, "ws.cmd.a.fk.merge", {"from": "src"})
        assert merged["version"] == 4  # forked at 2, its write 3: the refused ones left nothing
        back = await ok(na, "ws.cmd.a.src.merge", {"from": "fk"})  # reads the fork's own.txt
        assert [c["path"] for c in back["result"]["changes"]] == ["own.txt"]
        assert await read(na, "a", "src", "own.txt", back["version"]) == "the fork's\n"
