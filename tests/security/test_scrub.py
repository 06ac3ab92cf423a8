"""Issue 10, item 6 (last part): a secret that reached the log before it was registered is
scrubbed from a workspace's history by ``quill scrub``, through the real path: ``quill up`` as
a process with no secrets registry (so the secret is committed as is: in contents inline and
in WS_BLOBS, in paths, in a commit message, in an actor, in a file later modified and in one
moved), then ``quill scrub`` with the registry, then every stream, bucket and object store is
scanned for the value, and the workspace is read at every version, through the replica that
lived through the scrub, one started afterwards, and the executor's checkout."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig
from nats.js.errors import NotFoundError

from contracts import codec, hashing
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.events import SCRUB_OP, ChangesCommitted, HistoryCompacted, WorkspaceUpdated
from contracts.limits import LimitsPatch
from contracts.subjects import BUCKET_BLOBS, STREAM_APPROVALS, STREAM_AUDIT, Subjects
from core.plan import Committed
from core.secrets import Secrets
from infra import blobs
from infra import log as eventlog
from infra.blobs import INLINE_MAX, object_info
from infra.compaction import slack
from quill.client import Quill, Workspace
from quill_cli.tools import replay as rpl
from quill_cli.tools import scrub_stores
from quill_cli.tools.scrub import scrub
from tests.helpers import parked, start_reader
from tests.security.conftest import verify
from tests.up import Up

SECRET = "sk-live-9f8e7d6c5b4a3210"
MARK = "[REDACTED:leak]"
WS = "acme/leak"


@pytest_asyncio.fixture
async def quill(up: Up) -> AsyncIterator[Quill]:
    client = await Quill.connect(up.nats_url, actor="tester", timeout=10)
    yield client
    await client.close()


def registry(tmp_path: Path, **secrets: str) -> Path:
    path = tmp_path / "secrets.toml"
    lines = [f'{name} = "{value}"' for name, value in (secrets or {"leak": SECRET}).items()]
    path.write_text("[secrets]\n" + "\n".join(lines) + "\n")
    return path


async def all_messages(js: JetStreamContext) -> Iterator[tuple[str, str, bytes]]:
    """``(stream, subject, headers and payload)`` of every message of every stream (the
    event log, the audit stream, the KV buckets and the object stores' streams)."""
    found = []
    for info in await js.streams_info():
        name = str(info.config.name)
        seq = 1
        while True:
            try:
                msg = await js.get_msg(name, seq, subject=">", next=True)
            except NotFoundError:
                break
            assert msg.seq is not None
            raw = json.dumps(msg.headers or {}).encode() + (msg.data or b"")
            found.append((name, str(msg.subject), raw))
            seq = msg.seq + 1
    return iter(found)


async def the_log(js: JetStreamContext, subjects: Subjects) -> list[Committed]:
    subject = subjects.evt("acme", "leak")
    return await eventlog.read(js, subject, 0, await eventlog.last_seq(js, subject), timeout=10)


async def audit_records(
    js: JetStreamContext, subjects: Subjects, tenant: str = "acme", workspace: str = "leak"
) -> list[dict[str, Any]]:
    out, seq = [], 1
    while True:
        try:
            msg = await js.get_msg(
                STREAM_AUDIT, seq, subject=subjects.audit(tenant, workspace), next=True
            )
        except NotFoundError:
            return out
        assert msg.seq is not None and msg.data is not None
        out.append(json.loads(msg.data))
        seq = msg.seq + 1


async def leaks(js: JetStreamContext, secret: str = SECRET) -> list[str]:
    return [
        f"{stream} {subject}"
        for stream, subject, raw in await all_messages(js)
        if secret.encode() in raw or secret in subject
    ]


async def snapshot(ws: Workspace, version: int) -> dict[str, bytes]:
    """Every file of ``ws`` as of ``version``, by path."""
    files = {}
    async for entry in ws.list_all(recursive=True, kind="file", version=version):
        files[entry.path] = await ws.read_bytes(entry.path, version=version)
    return files


async def fill(quill: Quill, up: Up) -> int:
    """Commit the secret everywhere a client can put it; return the last version."""
    ws = quill.workspace(WS)
    await ws.create()
    await ws.write("notes.md", f"# notes\nkey: {SECRET}\n")  # inline content
    big = ("x" * 80 + "\n") * 1000 + f"token={SECRET}\n"  # > 64 KiB: stored in WS_BLOBS
    await ws.write("data/big.txt", big)
    await ws.write(f"keys/{SECRET}.txt", "named after the key\n")  # a path
    await ws.write("config.env", f"API_KEY={SECRET}\n")  # modified later: only v1 leaks
    await ws.write("config.env", "API_KEY=${API_KEY}\n")
    await ws.move("notes.md", "docs/notes.md")  # a put naming earlier content by sha256
    await ws.apply([rq.PutChange(path="applied.md", content="clean\n")], message=f"rotate {SECRET}")
    leaker = await Quill.connect(up.nats_url, actor=f"bot-{SECRET}", timeout=10)
    try:
        bot = leaker.workspace(WS)
        await bot.write("by-bot.md", "hello\n")  # an actor
    finally:
        await leaker.close()
    # a KV bucket holding it (every revision kept), next to the deployment's own buckets
    js = quill.nc.jetstream()
    kv = await js.create_key_value(KeyValueConfig(bucket="SCRUBTEST", history=5))
    await kv.put("token", f"value {SECRET}".encode())
    await kv.put("token", f"still {SECRET}".encode())
    await kv.put(f"key-{SECRET}", b"named after it")
    # the executor materialises a checkout of the workspace (it must be reset by the scrub)
    out = up.cli("exec", WS, "--", "cat docs/notes.md")
    assert SECRET in out.stdout
    return bot.last_version


async def test_scrub_takes_a_leaked_secret_out_of_every_store_and_version(
    up: Up, quill: Quill, tmp_path: Path
) -> None:
    js, subjects = quill.nc.jetstream(), Subjects()
    last = await fill(quill, up)
    ws = quill.workspace(WS)
    before = {v: await snapshot(ws, v) for v in range(1, last + 1)}
    history_before = await ws.history("config.env")
    assert await leaks(js), "the secret reached the stores (no registry at write time)"
    head = await the_log(js, subjects)

    dry = up.cli("--json", "scrub", WS, "--secrets", str(registry(tmp_path)), "--dry-run")
    assert json.loads(dry.stdout)["dry_run"] and await leaks(js), "a dry run changes nothing"

    updates = await quill.nc.subscribe(subjects.updated("acme", "leak"))
    await quill.nc.flush()
    done = up.cli("--json", "scrub", WS, "--secrets", str(registry(tmp_path)))
    update = codec.decode((await updates.next_msg(timeout=10)).data, WorkspaceUpdated)
    await updates.unsubscribe()
    assert (update.op, update.version) == (SCRUB_OP, last + 1)  # watchers learn of it
    result = json.loads(done.stdout)
    assert SECRET not in done.stdout + done.stderr
    assert result["secret_ids"] == ["leak"] and result["form"] == "events"
    assert result["version"] == last + 1 and result["old_head"] == head[-1].hash
    assert f"keys/{MARK}.txt" in result["paths_changed"]
    assert result["blobs_deleted"] == 1  # data/big.txt's; the other contents were inline
    assert len(result["replicas"]) == 1  # quill up's reader, rebuilt and agreeing

    # 1. No stream, bucket or object store holds the value anymore.
    assert await leaks(js) == []

    kv = await js.key_value("SCRUBTEST")
    assert (await kv.get("token")).value == f"still {MARK}".encode()
    assert result["kv_entries"] == 3
    assert result["outputs_purged"] == 1  # the kept output of `cat docs/notes.md`

    # 2. The log is re-chained and closes with the scrub's event; quill verify passes (the
    # replica that lived through the scrub agrees with the new log).
    fold = await rpl.replay(js, subjects, "acme", "leak")
    assert (fold.version, fold.last_hash) == (last + 1, result["head"])
    events = await the_log(js, subjects)
    assert [e.event.version for e in events] == list(range(1, last + 2))
    closing = events[-1].event
    assert isinstance(closing, HistoryCompacted) and closing.op == SCRUB_OP
    verify(up, WS)

    # 3. Every version reads the redacted content, everything else unchanged.
    for v in range(1, last + 1):
        want = {
            path.replace(SECRET, MARK): data.replace(SECRET.encode(), MARK.encode())
            for path, data in before[v].items()
        }
        assert await snapshot(ws, v) == want, f"version {v}"
    assert (await ws.read_text("docs/notes.md")) == f"# notes\nkey: {MARK}\n"
    assert (await ws.read_text("config.env", version=5)) == f"API_KEY={MARK}\n"

    # 4. History and diff still work, and say nothing of the secret.
    history = await ws.history("config.env")
    assert [r.version for r in history.revisions] == [r.version for r in history_before.revisions]
    diff = await ws.diff(5, 6, "config.env")
    assert MARK in str(diff) and SECRET not in str(diff)
    page = await ws.history()
    assert SECRET not in str(page) and f"bot-{MARK}" in str(page)
    messages = [e.event.message for e in events if isinstance(e.event, ChangesCommitted)]
    assert f"rotate {MARK}" in messages

    # 5. A replica started afterwards builds the same workspace from the new log.
    async with AsyncExitStack() as readers:
        late = await start_reader(readers, up.nats_url, tmp_path / "late", instance="late")
        check = await rpl.check_replica(quill.nc, subjects, fold, late.instance, deep=True)
        assert check.ok, check.problems
        verify(up, WS)

    # 6. The executor's checkout was rebuilt: the command sees the redacted tree.
    out = up.cli("exec", WS, "--", "cat docs/notes.md; ls keys")
    assert SECRET not in out.stdout + out.stderr
    assert MARK in out.stdout and f"{MARK}.txt" in out.stdout

    # 7. A new write chains on the scrub's event.
    await ws.write("after.md", "after the scrub\n")
    assert ws.last_version == last + 2
    tail = await the_log(js, subjects)
    assert tail[-1].event.prev_hash == result["head"]
    verify(up, WS)

    # 8. The scrub is audited by secret id, never by value.
    records = [r for r in await audit_records(js, subjects) if r["op"] == SCRUB_OP]
    assert len(records) == 1, "one audit record scrub"
    details = records[0]["details"]
    assert details["secret_ids"] == ["leak"] and details["new_head"] == result["head"]
    assert details["old_head"] == head[-1].hash

    # 9. Nothing left to scrub: refused, and so is a workspace that does not exist.
    again = up.cli("scrub", WS, "--secrets", str(registry(tmp_path)), check=False)
    assert again.returncode != 0 and "No registered secret occurs" in again.stderr
    missing = up.cli("scrub", "acme/nope", "--secrets", str(registry(tmp_path)), check=False)
    assert missing.returncode != 0 and "not found" in missing.stderr


async def redacted_everywhere(
    ws: Workspace, before: dict[int, dict[str, bytes]], **ids: str
) -> None:
    """Every version of ``ws`` reads as ``before`` with each secret (id=value) redacted."""

    def redact(text: str) -> str:
        for name, value in ids.items():
            text = text.replace(value, f"[REDACTED:{name}]")
        return text

    for v, files in before.items():
        want = {redact(p): redact(d.decode()).encode() for p, d in files.items()}
        assert await snapshot(ws, v) == want, f"version {v}"


async def test_a_log_too_long_for_one_batch_keeps_its_scrubbed_history_in_the_manifest(
    up: Up, quill: Quill, tmp_path: Path
) -> None:
    secret, name = "ghp_longlog0123456789abcdef", "acme/long"
    ws = quill.workspace(name)
    await ws.create()
    for i in range(4):
        await ws.write(f"f{i}.md", f"line {i}: {secret}\n")
    await ws.write(f"dir/{secret}/x.md", "x\n")
    up.cli("exec", name, "--", "true")  # a checkout of the workspace
    before = {v: await snapshot(ws, v) for v in range(1, ws.last_version + 1)}
    reg = str(registry(tmp_path, gh=secret))
    done = up.cli("--json", "scrub", name, "--secrets", reg, "--max-batch", "3")
    result = json.loads(done.stdout)
    assert result["form"] == "manifest" and result["secret_ids"] == ["gh"]
    assert await leaks(quill.nc.jetstream(), secret) == []
    verify(up, name)
    await redacted_everywhere(ws, before, gh=secret)
    out = up.cli("exec", name, "--", "cat f0.md; ls dir")
    assert secret not in out.stdout and "[REDACTED:gh]" in out.stdout
    await ws.write("after.md", "after\n")
    assert ws.last_version == result["version"] + 1
    verify(up, name)


async def test_a_secret_registered_late_is_scrubbed_from_a_log_scrubbed_before(
    up: Up, quill: Quill, tmp_path: Path
) -> None:
    """The second scrub rewrites the first one's event too (its manifest, which held the
    second secret, is replaced and deleted)."""
    first, late, name = "xoxb-first-0123456789", "AKIAlate0123456789XY", "acme/twice"
    ws = quill.workspace(name)
    await ws.create()
    await ws.write("a.md", f"{first} and {late}\n")
    await ws.write(f"{late}.md", "named\n")
    before = {v: await snapshot(ws, v) for v in range(1, ws.last_version + 1)}
    up.cli("scrub", name, "--secrets", str(registry(tmp_path, slack=first)))
    await ws.write("b.md", f"again {late}\n")
    before[ws.last_version] = await snapshot(ws, ws.last_version)  # after the first scrub
    done = up.cli("--json", "scrub", name, "--secrets", str(registry(tmp_path, aws=late)))
    assert json.loads(done.stdout)["form"] == "events"
    js = quill.nc.jetstream()
    assert await leaks(js, first) == [] and await leaks(js, late) == []
    verify(up, name)
    await redacted_everywhere(ws, before, slack=first, aws=late)
    assert (await ws.read_text("b.md")) == "again [REDACTED:aws]\n"


async def test_a_write_that_gets_in_first_makes_the_scrub_change_nothing(
    up: Up, quill: Quill, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The new log is appended on the condition that the old one still ends where it was read:
    a command committed in between wins, and the scrub is refused whole."""
    secret, name = "sk-race-0123456789abcdef", "acme/race"
    ws = quill.workspace(name)
    await ws.create()
    await ws.write("k.md", f"{secret}\n")
    subject = Subjects().evt("acme", "race")
    real = rpl.append_batch

    async def first_a_write(*args: Any, **kwargs: Any) -> int:
        await ws.write("meanwhile.md", "in between\n")
        return await real(*args, **kwargs)

    monkeypatch.setattr(rpl, "append_batch", first_a_write)
    js = quill.nc.jetstream()
    before = await eventlog.last_seq(js, subject)
    with pytest.raises(QuillError) as refused:
        await scrub(quill.nc, Subjects(), "acme", "race", Secrets({"race": secret}))
    assert refused.value.code == ErrorCode.CONFLICT
    assert await eventlog.last_seq(js, subject) == before + 1  # the write, nothing else
    assert secret in await ws.read_text("k.md")
    verify(up, name)
    monkeypatch.setattr(rpl, "append_batch", real)
    done = await scrub(quill.nc, Subjects(), "acme", "race", Secrets({"race": secret}))
    assert done.version == 4 and await leaks(js, secret) == []
    verify(up, name)


async def test_refused_when_redacting_would_merge_two_paths(up: Up, quill: Quill) -> None:
    secret = "sk-refuse-0123456789ab"
    ws = quill.workspace("acme/merge")
    await ws.create()
    await ws.write(f"a-{secret}.md", "one\n")
    await ws.write(f"a-{MARK}.md", "two\n")
    with pytest.raises(QuillError) as merged:
        await scrub(quill.nc, Subjects(), "acme", "merge", Secrets({"leak": secret}))
    assert merged.value.code == ErrorCode.INVALID_ARGUMENT and secret not in str(merged.value)
    assert "two paths would both become" in merged.value.message
    verify(up, "acme/merge")


async def test_a_compacted_log_is_scrubbed_manifest_and_all(up: Up, quill: Quill) -> None:
    """``max_versions`` purged the log's beginning: the compaction's manifest (its kept
    revisions, event rows and contents) holds the secret, and is rewritten too."""
    secret, name = "sk-compact-0123456789ab", "acme/compacted"
    ws = quill.workspace(name)
    await ws.create(limits=LimitsPatch(max_versions=1))
    await ws.write(f"k-{secret}.md", f"{secret}\n")
    updates = await quill.nc.subscribe(Subjects().updated("acme", "compacted"))
    async with asyncio.timeout(30):
        for i in range(1 + slack(1) + 1):
            await ws.write("hot.md", f"{i}\n")
        async for msg in updates.messages:  # the writer compacts after it answered
            if codec.decode(msg.data, WorkspaceUpdated).op == "compact":
                break
    await updates.unsubscribe()
    await ws.write("late.md", f"after the compaction: {secret}\n")
    js, subject = quill.nc.jetstream(), Subjects().evt("acme", "compacted")
    first = (await eventlog.read(js, subject, 0, await eventlog.last_seq(js, subject)))[0]
    assert isinstance(first.event, HistoryCompacted), "the log starts at a compaction"
    floor = first.event.floor
    before = {v: await snapshot(ws, v) for v in range(floor, ws.last_version + 1)}
    done = await scrub(quill.nc, Subjects(), "acme", "compacted", Secrets({"c": secret}))
    assert done.form == "events" and done.paths_changed == ["k-[REDACTED:c].md"]
    assert await leaks(js, secret) == []
    verify(up, name)
    await redacted_everywhere(ws, before, c=secret)
    out = up.cli("replay", name, "--to-version", str(floor), "--out", str(Path(up.data) / "r"))
    assert "replayed acme/compacted" in out.stdout
    assert (Path(up.data) / "r" / "k-[REDACTED:c].md").read_text() == "[REDACTED:c]\n"


def test_the_docs_example_runs_as_written(up: Up, tmp_path: Path) -> None:
    """docs/replay.md, "Scrubbing a leaked secret": its registry and its commands."""
    text = (Path(__file__).parents[2] / "docs" / "replay.md").read_text()
    section = text[text.index("## Scrubbing a leaked secret") :]
    toml = re.search(r"```toml\n(.*?)```", section, re.S)
    shell = re.search(r"```shell\n(.*?)```", section, re.S)
    assert toml and shell
    (tmp_path / "leaked.toml").write_text(toml.group(1))
    secret = re.findall(r'"(.*)"', toml.group(1))[0]
    quill = f"{sys.executable} -m quill"
    done = subprocess.run(
        ["bash", "-c", shell.group(1).replace("quill ", f"{quill} ")],
        cwd=tmp_path,
        env={**os.environ, "QUILL_NATS_URL": up.nats_url},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    dry = next(line for line in lines if line.startswith("dry run:"))
    assert dry.startswith("dry run: openai found in acme/app: 1 event, 1 content, 0 paths")
    said = [c.split("# ", 1)[1] for c in shell.group(1).splitlines() if c.startswith("# ")]
    at = lines.index(next(line for line in lines if line.startswith("scrubbed ")))
    assert lines[at] == said[0]
    assert (
        lines[at + 1].startswith("log: version 3 head ") and "-> version 4 head " in lines[at + 1]
    )
    assert lines[at + 1].endswith("0 blobs deleted; verified")  # it was inline
    assert lines[at + 2] == "1 reader replica rebuilt and agreeing"
    assert lines[-1].endswith("key: [REDACTED:openai]")
    assert secret not in done.stdout + done.stderr
    verify(up, "acme/app")


async def blob_exists(js: JetStreamContext, sha: str) -> bool:
    obs = await js.object_store(BUCKET_BLOBS)
    try:
        return not (await obs.get_info(sha)).deleted
    except NotFoundError:
        return False


async def legacy(js: JetStreamContext, data: bytes, *names: str) -> None:
    """Make ``data`` as an earlier version stored it for the workspaces ``names``: one object
    under the bare sha256, shared by all of them, none under their own prefixes."""
    sha = hashing.content_sha256(data)
    await (await js.object_store(BUCKET_BLOBS)).put(sha, data)
    for name in names:
        assert await blobs.remove(js, f"{name}/{sha}")


def replayed(up: Up, name: str, version: int, out: Path) -> dict[str, bytes]:
    """``quill replay`` of ``name`` as of ``version``: from the log and WS_BLOBS alone (no
    replica's cache), every file by path."""
    up.cli("replay", name, "--to-version", str(version), "--out", str(out))
    return {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}


async def test_a_scrub_deletes_its_own_object_and_leaves_another_tenants_copy(
    up: Up, quill: Quill
) -> None:
    """Each workspace has its own copy of a content in WS_BLOBS: scrubbing one deletes its copy
    (no other workspace can name it), names no one, and the other tenant's copy still reads."""
    secret = "sk-owncopy-0123456789abcd"
    big = ("v" * 80 + "\n") * 1000 + f"token={secret}\n"
    sha = hashing.content_sha256(big.encode())
    mine, theirs = quill.workspace("acme/owncopy"), quill.workspace("globex/owncopy")
    for ws in (mine, theirs):
        await ws.create()
        await ws.write("big.txt", big)
    js = quill.nc.jetstream()
    assert await object_info(js, f"acme/owncopy/{sha}") is not None
    done = await scrub(quill.nc, Subjects(), "acme", "owncopy", Secrets({"owncopy": secret}))
    assert (done.blobs_kept, done.shared_with) == (0, [])
    assert await object_info(js, f"acme/owncopy/{sha}") is None
    assert await object_info(js, f"globex/owncopy/{sha}") is not None
    assert await theirs.read_text("big.txt") == big
    verify(up, "globex/owncopy")
    verify(up, "acme/owncopy")


async def test_a_blob_another_tenants_workspace_holds_too_is_kept_until_that_one_is_scrubbed(
    up: Up, quill: Quill, tmp_path: Path
) -> None:
    """A legacy object (named by the bare sha256, shared by every workspace that wrote the same
    content before workspaces had their own): scrubbing acme/shared must not delete the blob
    globex/shared (same content) reads; the scrub names globex/shared instead, and the blob
    goes with globex/shared's own scrub."""
    secret = "sk-shared-0123456789abcdef"
    big = ("y" * 80 + "\n") * 1000 + f"token={secret}\n"
    assert len(big) > INLINE_MAX  # stored in WS_BLOBS, once for both workspaces
    sha = hashing.content_sha256(big.encode())
    first, second = quill.workspace("acme/shared"), quill.workspace("globex/shared")
    await first.create()
    await first.write("big.txt", big)
    await first.write("big.txt", "rotated\n")
    await second.create()
    await second.write("copy/big.txt", big)  # the latest version still holds it
    await second.write("other.md", "other\n")
    js = quill.nc.jetstream()
    await legacy(js, big.encode(), "acme/shared", "globex/shared")
    assert await blob_exists(js, sha)
    want = {v: await snapshot(second, v) for v in range(1, second.last_version + 1)}
    reg = str(registry(tmp_path, shared=secret))

    dry = up.cli("scrub", "acme/shared", "--secrets", reg, "--dry-run")
    done = up.cli("scrub", "acme/shared", "--secrets", reg)

    # globex/shared reads its file intact at every version, from the log and WS_BLOBS alone
    for v, files in want.items():
        assert replayed(up, "globex/shared", v, tmp_path / f"r{v}") == files, f"version {v}"
    assert await blob_exists(js, sha)
    verify(up, "globex/shared")

    # the scrub (and its dry run) named the workspace that holds the same content
    assert "globex/shared" in dry.stdout and secret not in dry.stdout + dry.stderr
    assert secret not in done.stdout + done.stderr
    assert "1 blob kept: globex/shared holds the same content: scrub it too" in done.stdout
    verify(up, "acme/shared")
    assert "[REDACTED:shared]" in await first.read_text("big.txt", version=2)

    # the audit record of the scrub names it too (never the secret)
    records = [r for r in await audit_records(js, Subjects(), "acme", "shared")
               if r["op"] == SCRUB_OP]  # fmt: skip
    details = records[-1]["details"]
    assert details["shared_with"] == ["globex/shared"] and details["blobs_kept"] == 1
    assert secret not in json.dumps(records)

    # scrubbing globex/shared deletes the blob: no other workspace refers to it any more
    last = json.loads(up.cli("--json", "scrub", "globex/shared", "--secrets", reg).stdout)
    assert last["blobs_deleted"] == 1 and last["shared_with"] == []
    assert not await blob_exists(js, sha)
    assert await leaks(js, secret) == []
    verify(up, "globex/shared")
    files = replayed(up, "globex/shared", 2, tmp_path / "after")
    assert files["copy/big.txt"] == big.replace(secret, "[REDACTED:shared]").encode()


async def compacted_with(ws: Workspace, quill: Quill, path: str, content: str) -> None:
    """Create ``ws`` with ``max_versions=1``, write ``content`` to ``path``, and write another
    file until the writer compacts: the put naming ``content`` is purged from the log, only
    the compaction's manifest names it."""
    tenant, name = ws.tenant, ws.name
    await ws.create(limits=LimitsPatch(max_versions=1))
    await ws.write(path, content)
    updates = await quill.nc.subscribe(Subjects().updated(tenant, name))
    async with asyncio.timeout(30):
        for i in range(1 + slack(1) + 1):
            await ws.write("hot.md", f"{i}\n")
        async for msg in updates.messages:
            if codec.decode(msg.data, WorkspaceUpdated).op == "compact":
                break
    await updates.unsubscribe()
    js, subject = quill.nc.jetstream(), Subjects().evt(tenant, name)
    log = await eventlog.read(js, subject, 0, await eventlog.last_seq(js, subject))
    assert isinstance(log[0].event, HistoryCompacted), "the log starts at a compaction"
    puts = [e for e in log if isinstance(e.event, ChangesCommitted)
            for c in e.event.changes if c.path == path]  # fmt: skip
    assert puts == [], "only the manifest names the content"


async def test_a_blob_only_a_compaction_manifest_names_is_kept_and_several_scrub_together(
    up: Up, quill: Quill, tmp_path: Path
) -> None:
    """The other workspace names the blob only through its compaction's manifest; then the
    two that still hold it are scrubbed in one call, and the last one deletes the blob."""
    secret = "sk-trio-0123456789abcdef"
    big = ("z" * 80 + "\n") * 1000 + f"token={secret}\n"
    sha = hashing.content_sha256(big.encode())
    one, two, three = (quill.workspace(f"{t}/trio") for t in ("acme", "globex", "initech"))
    await one.create()
    await one.write("big.txt", big)
    await compacted_with(two, quill, "kept/big.txt", big)
    await three.create()
    await three.write("big.txt", big)
    js = quill.nc.jetstream()
    await legacy(js, big.encode(), "acme/trio", "globex/trio", "initech/trio")
    want = {ws.tenant: (v := ws.last_version, await snapshot(ws, v)) for ws in (one, two, three)}
    reg = str(registry(tmp_path, trio=secret))

    first = json.loads(up.cli("--json", "scrub", "acme/trio", "--secrets", reg).stdout)
    for tenant in ("globex", "initech"):  # both still read it, from the log and WS_BLOBS
        v, files = want[tenant]
        assert replayed(up, f"{tenant}/trio", v, tmp_path / tenant) == files, tenant
        verify(up, f"{tenant}/trio")
    assert first["shared_with"] == ["globex/trio", "initech/trio"]
    assert (first["blobs_kept"], first["blobs_deleted"]) == (1, 0)

    done = up.cli("--json", "scrub", "globex/trio", "initech/trio", "--secrets", reg)
    second, third = (json.loads(line) for line in done.stdout.splitlines())
    assert second["workspace"] == "trio" and second["tenant"] == "globex"
    assert second["shared_with"] == ["initech/trio"] and second["blobs_kept"] == 1
    assert third["shared_with"] == [] and third["blobs_deleted"] == 1
    assert not await blob_exists(js, sha)
    assert await leaks(js, secret) == []
    for ws in (one, two, three):
        v, files = want[ws.tenant]
        got = replayed(up, f"{ws.tenant}/trio", v, tmp_path / f"after-{ws.tenant}")
        assert got == {p: d.replace(secret.encode(), b"[REDACTED:trio]") for p, d in files.items()}
        verify(up, f"{ws.tenant}/trio")


async def test_a_write_of_the_same_content_while_the_blob_is_deleted_gets_it_back(
    up: Up, quill: Quill, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Another workspace names a legacy object between the scrub's reading of the other logs
    and its deletion: the scrub reads the events appended meanwhile and puts the object back
    for it."""
    secret = "sk-race-blob-0123456789ab"
    big = ("w" * 80 + "\n") * 1000 + f"token={secret}\n"
    sha = hashing.content_sha256(big.encode())
    ws, late = quill.workspace("acme/racer"), quill.workspace("globex/racer")
    await ws.create()
    await ws.write("big.txt", big)
    await legacy(quill.nc.jetstream(), big.encode(), "acme/racer")
    await late.create()
    real = scrub_stores.referrers
    calls = 0

    async def then_a_write(*args: Any, **kwargs: Any) -> tuple[dict[str, set[str]], int]:
        nonlocal calls
        calls += 1
        found = await real(*args, **kwargs)
        if calls == 1:  # the other logs are read: now globex/racer writes the same content
            await late.write("big.txt", big)
        return found

    monkeypatch.setattr(scrub_stores, "referrers", then_a_write)
    done = await scrub(quill.nc, Subjects(), "acme", "racer", Secrets({"racer": secret}))
    assert calls == 2
    assert (done.blobs_deleted, done.blobs_kept, done.shared_with) == (0, 1, ["globex/racer"])
    js = quill.nc.jetstream()
    assert await blob_exists(js, sha)
    v = late.last_version
    assert replayed(up, "globex/racer", v, tmp_path / "r")["big.txt"] == big.encode()
    verify(up, "globex/racer")


async def test_requests_parked_for_approval_and_their_outcomes_are_scrubbed(
    up: Up, quill: Quill, tmp_path: Path
) -> None:
    """WS_APPROVALS keeps parked requests (their bodies) and outcomes for up to a week: a
    secret that got in is found there too; a parked request that held one is deleted (once
    approved it is not carried out: not kept), an outcome re-published redacted."""
    js = quill.nc.jetstream()
    ws = quill.workspace("acme/parked")
    await ws.create(trust="restricted")
    waiting = await parked(ws.write("plan.md", f"key: {SECRET}\n"))
    named = await parked(ws.write(f"keys/{SECRET}.md", "named after it\n"))
    await ws.approve(named)
    done = await ws.wait_approval(named, timeout=30)
    assert done.outcome is not None and done.outcome.result is not None, done

    async def kept_with_it() -> list[str]:
        return [
            subject
            for stream, subject, raw in await all_messages(js)
            if stream == STREAM_APPROVALS and SECRET.encode() in raw
        ]

    assert len(await kept_with_it()) == 3, "the secret is in WS_APPROVALS"

    done_cli = up.cli("--json", "scrub", "acme/parked", "--secrets", str(registry(tmp_path)))
    result = json.loads(done_cli.stdout)
    assert await kept_with_it() == []
    assert result["approvals"] == 3  # two parked bodies, one outcome
    again = await ws.approval(named)
    assert again.outcome is not None and again.outcome.result is not None
    assert again.outcome.result["path"] == f"keys/{MARK}.md"
    await ws.approve(waiting)  # its request is gone with the secret: not carried out
    status = await ws.wait_approval(waiting, timeout=30)
    assert status.outcome is not None and status.outcome.error is not None, status
    assert status.outcome.error.code == "FILE_NOT_FOUND"
    assert (await ws.list(".")).entries[0].path == "keys"


async def test_a_source_with_forks_and_a_fork_are_refused_naming_them(
    up: Up, quill: Quill, tmp_path: Path
) -> None:
    """Issue 33: a fork's history up to its fork point is its source's. Scrubbing the source
    would leave the secret in what its forks read and break their chains; scrubbing a fork
    cannot reach what it inherited. Both are refused (``CONFLICT``), naming the forks or the
    source, and nothing is rewritten; once the fork is purged, the source is scrubbed."""
    src = quill.workspace("acme/leaky")
    await src.create()
    await src.write("config.env", f"KEY={SECRET}\n")
    await quill.fork("acme/leaky", "leaky-try")
    fork = quill.workspace("acme/leaky-try")
    await fork.write("notes.md", f"also {SECRET}\n")
    head = (await src.info()).last_hash
    reg = str(registry(tmp_path))
    refused = up.cli("--json", "scrub", "acme/leaky", "--secrets", reg, check=False)
    assert refused.returncode != 0 and "has forks (leaky-try)" in refused.stderr, refused.stderr
    assert "CONFLICT" in refused.stderr
    refused = up.cli("--json", "scrub", "acme/leaky-try", "--secrets", reg, check=False)
    assert refused.returncode != 0 and "is a fork of leaky at v2" in refused.stderr
    assert (await src.info()).last_hash == head  # nothing rewritten
    assert await fork.read_text("config.env") == f"KEY={SECRET}\n"
    up.cli("purge", "acme/leaky-try", "--yes")
    done = up.cli("--json", "scrub", "acme/leaky", "--secrets", reg)
    assert done.returncode == 0
    assert await src.read_text("config.env") == f"KEY={MARK}\n"
