"""Forks as an attacker tries them (issue 33), through ``quill up`` with tenants and bare
nats-py clients holding each tenant's credentials: a fork stays within the tenant of its
subject (another tenant's workspace is not found by name, cannot be named with its tenant,
and another tenant's subjects are not reachable), a fork named like its source or like an
existing workspace is refused, so is one at a version the source does not have or that was
compacted away; a source with forks is neither purged nor compacted (their history is
partly its own)."""

from __future__ import annotations

import nats.errors
import pytest

from contracts.errors import ErrorCode
from tests.bare import answer, code
from tests.helpers import eventually
from tests.integration.test_compaction import KEEP, WRITES
from tests.up import TENANTS, Up, bare

pytestmark = pytest.mark.up(tenants=TENANTS)


async def test_a_fork_stays_within_its_tenant(up: Up) -> None:
    async with bare(up, "a") as na, bare(up, "b") as nb:
        assert code(await answer(na, "ws.cmd.a.private.create", {})) is None
        secret = {"path": "secret.txt", "content": "tenant a's own\n"}
        assert code(await answer(na, "ws.cmd.a.private.write", secret)) is None
        # b names a's workspace: looked up in b's own tenant, where it does not exist
        found = await answer(nb, "ws.cmd.b.stolen.fork", {"from": "private"})
        assert code(found) == ErrorCode.WORKSPACE_NOT_FOUND
        # a workspace of another tenant cannot even be named
        for name in ("a/private", "../a/private", "a.private"):
            named = await answer(nb, "ws.cmd.b.stolen.fork", {"from": name})
            assert code(named) == ErrorCode.INVALID_ARGUMENT, name
        # nor can b send on a's subjects (NATS refuses them: nobody answers)
        with pytest.raises(nats.errors.Error):
            await nb.request("ws.cmd.a.stolen.fork", b'{"from": "private"}', timeout=2)
        gone = await answer(nb, "ws.qry.b.stolen.read", {"path": "secret.txt"})
        assert code(gone) == ErrorCode.WORKSPACE_NOT_FOUND
        listed = await answer(na, "ws.qry.a._.workspaces", {"prefix": "stolen"})
        assert listed["result"]["workspaces"] == []


async def test_bad_forks_are_refused_and_a_forked_source_kept(up: Up) -> None:
    async with bare(up, "a") as na:
        assert code(await answer(na, "ws.cmd.a.base.create", {})) is None
        for i in range(3):
            write = {"path": f"f{i}.txt", "content": f"{i}\n"}
            assert code(await answer(na, "ws.cmd.a.base.write", write)) is None  # v2..v4
        assert code(await answer(na, "ws.cmd.a.other.create", {})) is None
        cases = [
            ("base", {"from": "base"}, ErrorCode.ALREADY_EXISTS),  # named like its source
            ("other", {"from": "base"}, ErrorCode.ALREADY_EXISTS),  # an existing workspace
            ("new", {"from": "base", "version": 5}, ErrorCode.INVALID_ARGUMENT),  # not yet
            ("new", {"from": "base", "version": 0}, ErrorCode.INVALID_ARGUMENT),
            ("new", {"from": "nothing"}, ErrorCode.WORKSPACE_NOT_FOUND),
        ]
        for name, body, expected in cases:
            assert code(await answer(na, f"ws.cmd.a.{name}.fork", body)) == expected, (name, body)
        ok = await answer(na, "ws.cmd.a.child.fork", {"from": "base", "version": 3})
        assert code(ok) is None and ok["result"]["version"] == 3
        read = await answer(na, "ws.qry.a.child.read", {"path": "f1.txt"})
        assert read["result"]["content"] == "1\n"
        missing = await answer(na, "ws.qry.a.child.read", {"path": "f2.txt"})  # made at 4
        assert code(missing) == ErrorCode.FILE_NOT_FOUND
        # its forks read its history: the source is not purged under them
        purge = await answer(na, "ws.cmd.a.base.purge", {"confirm": "a/base"})
        assert code(purge) == ErrorCode.CONFLICT and purge["error"]["details"]["forks"] == ["child"]
        assert code(await answer(na, "ws.qry.a.child.read", {"path": "f0.txt"})) is None


async def test_a_fork_below_a_compaction_is_refused(up: Up) -> None:
    async with bare(up, "a") as na:
        created = await answer(na, "ws.cmd.a.hot.create", {"limits": {"max_versions": KEEP}})
        assert code(created) is None
        for i in range(WRITES + 1):
            write = {"path": "hot.md", "content": f"hot {i}\n"}
            assert code(await answer(na, "ws.cmd.a.hot.write", write)) is None
        # the compaction follows the write that made it due: the log's oldest moves past 2

        async def compacted() -> bool:
            info = await answer(na, "ws.qry.a.hot.events", {"after": 0, "limit": 1})
            return bool(info["result"]["events"]) and info["result"]["events"][0]["version"] > 2

        await eventually(compacted, what="the compaction")
        trimmed = await answer(na, "ws.cmd.a.cold.fork", {"from": "hot", "version": 2})
        assert code(trimmed) == ErrorCode.VERSION_TRIMMED
        assert trimmed["error"]["details"]["floor"] > 2


async def test_a_fork_is_never_compacted_nor_its_source_while_forked(up: Up) -> None:
    """A fork inherits its source's ``max_versions``; compacting it would purge its log
    before the compaction, ``workspace_forked`` included (what ties its history to its
    source's), and keep only its own rows. Neither is compacted: both logs start at version
    1, every write is its own version, the fork still reads what it inherited, and ``info``
    says why (``compaction``)."""
    async with bare(up, "a") as na:
        created = await answer(na, "ws.cmd.a.capped.create", {"limits": {"max_versions": KEEP}})
        assert code(created) is None
        base = {"path": "kept.txt", "content": "inherited\n"}
        assert code(await answer(na, "ws.cmd.a.capped.write", base)) is None  # v2
        assert code(await answer(na, "ws.cmd.a.branch.fork", {"from": "capped"})) is None
        for name in ("branch", "capped"):
            for i in range(WRITES + 1):
                write = {"path": "hot.md", "content": f"hot {i}\n"}
                assert code(await answer(na, f"ws.cmd.a.{name}.write", write)) is None
            # one more: a compaction made due above would be appended before it is decided
            last = await answer(na, f"ws.cmd.a.{name}.write", {"path": "z.txt", "content": "z"})
            assert last["version"] == 2 + WRITES + 2, (name, last)
            first = await answer(na, f"ws.qry.a.{name}.events", {"after": 0, "limit": 1})
            assert first["result"]["events"][0]["version"] == 1, name
        read = await answer(na, "ws.qry.a.branch.read", {"path": "kept.txt"})
        assert read["result"]["content"] == "inherited\n"
        info = await answer(na, "ws.qry.a.branch.info", {})
        assert info["result"]["compaction"] == "fork"
        info = await answer(na, "ws.qry.a.capped.info", {})
        assert info["result"]["compaction"] == "has_forks"


async def test_a_diff_between_workspaces_stays_within_its_tenant(up: Up) -> None:
    """``qry.diff`` with ``from_workspace`` (issue 33) names a workspace of the tenant of its
    subject: another tenant's is not found by its name (nor its fork, whose history meets
    the named one's), cannot be named with its tenant, and a workspace of the same name in
    one's own tenant is one's own (its diff never shows the other tenant's content)."""
    async with bare(up, "a") as na, bare(up, "b") as nb:
        assert code(await answer(na, "ws.cmd.a.dsecret.create", {})) is None
        secret = {"path": "secret.txt", "content": "tenant a's own\n"}
        assert code(await answer(na, "ws.cmd.a.dsecret.write", secret)) is None
        assert code(await answer(na, "ws.cmd.a.dforked.fork", {"from": "dsecret"})) is None
        # a's diff across its own fork is answered once the reader holds both (so what b
        # is refused below is there to be found)
        body = {"from_version": 2, "from_workspace": "dsecret", "min_version": 2}
        own = await answer(na, "ws.qry.a.dforked.diff", body)
        assert own["ok"] and own["result"]["files"] == [], own
        assert code(await answer(nb, "ws.cmd.b.dmine.create", {})) is None
        mine = {"path": "secret.txt", "content": "tenant b's own\n"}
        assert code(await answer(nb, "ws.cmd.b.dmine.write", mine)) is None
        for name in ("dsecret", "dforked"):
            body = {"from_version": 1, "from_workspace": name, "min_version": 2}
            found = await answer(nb, "ws.qry.b.dmine.diff", body)
            assert code(found) == ErrorCode.WORKSPACE_NOT_FOUND, (name, found)
        for name in ("a/dsecret", "../a/dsecret", "a.dsecret", "a/dforked"):
            body = {"from_version": 1, "from_workspace": name, "min_version": 2}
            named = await answer(nb, "ws.qry.b.dmine.diff", body)
            assert code(named) == ErrorCode.INVALID_ARGUMENT, (name, named)
        # b's own "dsecret" (a fork of its own "dmine") is b's alone
        assert code(await answer(nb, "ws.cmd.b.dsecret.fork", {"from": "dmine"})) is None
        again = {"path": "secret.txt", "content": "tenant b's fork\n"}
        assert code(await answer(nb, "ws.cmd.b.dsecret.write", again)) is None
        body = {"from_version": 2, "from_workspace": "dmine", "min_version": 3}
        diff = await answer(nb, "ws.qry.b.dsecret.diff", body)
        assert diff["ok"], diff
        assert [f["path"] for f in diff["result"]["files"]] == ["secret.txt"], diff
        shown = diff["result"]["diff"]
        assert "-tenant b's own" in shown and "+tenant b's fork" in shown, diff
        assert "tenant a's" not in shown, diff
