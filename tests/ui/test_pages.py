"""The other pages: a file's history, the timeline's pages, runs, the audit search; and the
hash-chain check and the diff rendering on their own."""

from __future__ import annotations

import contextlib
import re
from datetime import UTC, datetime
from typing import Any

import httpx
from playwright.async_api import expect

from contracts import replies as rp
from contracts.errors import QuillError
from contracts.hashing import ZERO_HASH
from services.gateway.console import history, render
from services.gateway.server import Gateway
from tests.gateway.conftest import StartGateway

WS = "default/default"


async def test_a_files_history_links_each_revision(gateway: Gateway, page: Any) -> None:
    ws = gateway.quill.workspace(WS)
    for text in ("one\n", "two\n", "three\n"):
        await ws.write("doc.md", text)
    await page.goto(f"{gateway.url}/ui/w/default/file?path=doc.md")
    await page.get_by_role("link", name="History").click()
    rows = page.locator("main tbody tr")
    await expect(rows).to_have_count(3)
    await rows.nth(2).get_by_role("link").first.click()  # the oldest revision
    await expect(page.locator("#content")).to_contain_text("one")


async def test_the_timeline_pages_by_version(gateway: Gateway) -> None:
    ws = gateway.quill.workspace(WS)
    for i in range(60):
        await ws.write(f"f{i}.txt", "x\n")
    latest = ws.last_version
    async with httpx.AsyncClient(base_url=gateway.url, timeout=10) as http:
        first = (await http.get("/ui/w/default/")).text
        shown = [int(v) for v in re.findall(r'<tr id="v(\d+)"', first)]
        assert shown == list(range(latest, latest - history.PAGE, -1))
        older = re.search(r'href="\?before=(\d+)" rel="next"', first)
        assert older is not None and int(older.group(1)) == shown[-1]
        second = (await http.get(f"/ui/w/default/?before={older.group(1)}")).text
        rest = [int(v) for v in re.findall(r'<tr id="v(\d+)"', second)]
        assert rest == list(range(shown[-1] - 1, 0, -1)) and 'rel="next"' not in second
        assert "✓ verified" in first
        filtered = (await http.get("/ui/w/default/?path=f7.txt&op=cmd.write")).text
        assert re.findall(r'<tr id="v(\d+)"', filtered) == [str(latest - 52)]
        for hostile in ("?before=-1", "?before=abc", "?path=" + "x" * 5000, "?actor=%00"):
            assert (await http.get(f"/ui/w/default/{hostile}")).status_code == 200


async def test_runs_show_the_version_each_read(gateway: Gateway, page: Any) -> None:
    ws = gateway.quill.workspace(WS)
    await ws.write("a.txt", "before\n")
    async with ws.run("run-7") as run:
        await run.write("a.txt", "during\n")
        read = run.started.version
    await page.goto(f"{gateway.url}/ui/w/default/runs")
    row = page.locator("main tbody tr", has_text="run-7")
    await expect(row).to_contain_text(f"v{read}")
    await row.get_by_role("link", name=f"v{read}").click()
    await expect(page.locator("h1")).to_contain_text(f"as of version {read}")
    await page.get_by_role("link", name="a.txt").click()
    await expect(page.locator("#content")).to_contain_text("before")


async def test_the_audit_finds_failures(gateway: Gateway, page: Any) -> None:
    ws = gateway.quill.workspace(WS)
    await ws.write("a.txt", "x\n")
    try:
        await ws.read("missing.txt")
    except Exception:
        pass
    await page.goto(f"{gateway.url}/ui/w/default/audit")
    await page.get_by_label("Outcome").select_option("error")
    await page.get_by_role("button", name="Search").click()
    rows = page.locator("main tbody tr")
    await expect(rows.first).to_contain_text("FILE_NOT_FOUND")
    await expect(rows).to_have_count(1)


def event(version: int, digest: str, prev: str) -> rp.EventSummary:
    at = datetime.now(UTC)
    return rp.EventSummary(
        type="changes_committed", version=version, seq=version, at=at, op="cmd.write",
        actor=None, session=None, run=None, request_id=None, hash=digest, prev_hash=prev,
        tree_hash="t", changes=[], changes_total=0,
    )  # fmt: skip


def test_the_chain_check_names_the_first_broken_link() -> None:
    good = history.Chain()
    good.add([event(3, "c", "b"), event(4, "d", "c")])
    good.add([event(1, "a", ZERO_HASH), event(2, "b", "a")])  # the batch below
    assert (good.links, good.broken_at, good.newest_hash) == (4, None, "d")
    bad = history.Chain()
    bad.add([event(3, "c", "b"), event(4, "d", "X")])
    bad.add([event(1, "a", ZERO_HASH), event(2, "B", "a")])
    assert bad.broken_at == 4 and bad.broken is not None
    assert bad.broken.details == {"prev_hash": "X", "previous": "c"}
    gap = history.Chain()
    gap.add([event(1, "a", ZERO_HASH), event(3, "c", "a")])
    assert gap.broken_at == 3
    first = history.Chain()  # the first event follows the zero hash, as quill verify checks
    first.add([event(1, "a", "f" * 64), event(2, "b", "a")])
    assert first.broken_at == 1


def test_highlighting_keeps_one_escaped_line_per_line() -> None:
    text = 'x = """a\n<b>\n"""\ny = 1'
    lines = render.highlight_lines(text, "m.py")
    assert len(lines) == 4 and "&lt;b&gt;" in lines[1] and "<b>" not in lines[1]
    assert all(line.count("<span") == line.count("</span>") for line in lines)
    rows = [r for hunk in render.side_by_side("a\nb\n", "a\nc\nd\n", "t.txt") for r in hunk]
    assert [r.kind for r in rows] == ["same", "change", "add"]


async def test_the_audit_shows_new_records_live(gateway: Gateway, page: Any) -> None:
    ws = gateway.quill.workspace("default/default")
    await ws.write("seen-before.txt", "x")
    await page.goto(f"{gateway.url}/ui/w/default/audit?outcome=error")
    await expect(page.locator("#live-state")).to_have_text("on")
    await ws.write("a.txt", "fine")  # ok: not shown under outcome=error
    with contextlib.suppress(QuillError):
        await ws.read("missing-now.txt")
    rows = page.locator("#records tr")
    await expect(rows.first).to_contain_text("✗ FILE_NOT_FOUND")
    await expect(rows.first).to_contain_text("read")
    await expect(page.locator("#records")).not_to_contain_text("a.txt")


async def test_another_tenants_audit_stream_is_refused(start: StartGateway) -> None:
    gateway = await start({"token-acme-0001": "acme/one", "token-beta-0001": "beta/two"})
    beta = {"Authorization": "Bearer token-beta-0001"}
    async with httpx.AsyncClient(base_url=gateway.url, timeout=10) as http:
        for path in ("/ui/w/one/audit/live", "/ui/w/acme:one/audit/live", "/ui/w/one/audit"):
            got = await http.get(path, headers=beta)
            assert got.status_code in (400, 404) and "event:" not in got.text, path


async def test_a_forks_timeline_and_time_travel_cross_its_fork_point(gateway: Gateway) -> None:
    """A fork's timeline lists its own events, then the source's up to the fork point (its
    history *is* the source's there), with the hash chain verified across it; a file as of a
    version before the fork point reads as the source had it, and its diff across the point
    shows what each side did."""
    sdk = gateway.quill
    src = sdk.workspace("default/origin")
    await src.create(exist_ok=True)
    await src.write("a.txt", "one\n")
    await src.write("a.txt", "two\n")
    point = src.last_version
    await sdk.fork("default/origin", "branch")
    fork = sdk.workspace("default/branch")
    await fork.write("a.txt", "fork\n")
    await src.write("a.txt", "source later\n")  # not the fork's history
    await fork.info()
    async with httpx.AsyncClient(base_url=gateway.url, timeout=10) as http:
        page = (await http.get("/ui/w/branch/")).text
        shown = [int(v) for v in re.findall(r'<tr id="v(\d+)"', page)]
        assert shown == list(range(fork.last_version, 0, -1))  # across the fork point
        assert "✓ verified" in page, page[page.find('id="chain"') :][:600]
        old = (await http.get(f"/ui/w/branch/file?path=a.txt&v={point - 1}")).text
        assert "one" in old and "source later" not in old
        diff = (await http.get(f"/ui/w/branch/diff?from={point}&to={fork.last_version}")).text
        assert "two" in diff and "fork" in diff and "source later" not in diff
