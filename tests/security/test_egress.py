"""Issue 32, item 9 (egress): through the executor's proxy a command reaches the hosts the
operator allowed its workspace, at public addresses only; never a host not allowed, loopback,
a private or link-local address, the metadata service, by IP, by a name resolving to one or by
a redirect; a huge request head, too many connections, too many bytes are refused; every
connection is audited. A workspace not allowed gets no proxy, no variable and no socket, and
still no network.

Nothing here leaves the machine: names are resolved by a test resolver (``tests.egress_targets``)
and the one "public" address the proxy may connect to is sent to a loopback server by a test
dial; any other address the proxy tried to connect to fails the test (``policy``)."""

from __future__ import annotations

import asyncio
import base64
import json
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import pytest
import pytest_asyncio

from infra.exec.egress import Connection, HostPattern, Proxy, ProxyLimits, Rules
from infra.exec.sandbox import probe_bwrap
from quill.client import Quill
from services.executor.app import ExecutorConfig
from tests.egress_targets import PUBLIC, Target, policy, target
from tests.helpers import eventually, start_executor, start_reader, start_writer

HOSTS = (
    "pkgs.example.com",
    "redirect.example.com",
    "loop.example.com",
    "private.example.com",
    "meta.example.com",
    "mixed.example.com",
)
WHY_NO_BWRAP = probe_bwrap()


@pytest.fixture(scope="module")
def server() -> Iterator[Target]:
    with target() as state:
        yield state


@asynccontextmanager
async def proxy_for(
    server: Target, tmp_path: Path, limits: ProxyLimits | None = None, *, tcp: bool = False
) -> AsyncIterator[tuple[Proxy, list[Connection]]]:
    records: list[Connection] = []

    async def record(conn: Connection) -> None:
        records.append(conn)

    hosts = tuple(HostPattern.parse(h) for h in HOSTS)
    proxy = Proxy(hosts, policy(server, limits), record, tmp_path)
    await proxy.start(tcp=tcp)
    try:
        yield proxy, records
    finally:
        await proxy.close()


async def ask(proxy: Proxy, head: bytes) -> tuple[str, bytes]:
    """Send ``head`` to the proxy's socket; its status line and the rest until it closes."""
    reader, writer = await asyncio.open_unix_connection(str(proxy.socket))
    try:
        writer.write(head)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    status, _, rest = answer.partition(b"\r\n")
    return status.decode(), rest


def test_the_allow_list_admits_only_what_it_names() -> None:
    for bad in ("127.0.0.1", "10.0.0.1", "169.254.169.254", "[::1]", "localhost", "2130706433",
                "0x7f.1", "*.", "a b.com", "pypi.org:0", "pypi.org:99999"):  # fmt: skip
        with pytest.raises(ValueError):
            HostPattern.parse(bad)
    with pytest.raises(ValueError):
        Rules.parse(["Acme!=pypi.org"])
    with pytest.raises(ValueError):
        Rules.parse(["acme="])
    star = HostPattern.parse("*.pythonhosted.org")
    assert star.admits("files.pythonhosted.org", 443)
    assert not star.admits("pythonhosted.org", 443)
    assert not star.admits("evilpythonhosted.org", 443)
    assert not star.admits("files.pythonhosted.org", 22)  # 443 and 80 only, unless named
    assert HostPattern.parse("git.example.org:8443").admits("git.example.org", 8443)
    assert not HostPattern.parse("git.example.org:8443").admits("git.example.org", 443)
    assert HostPattern.parse("93.184.216.34").admits("93.184.216.34", 443)
    assert not HostPattern.parse("pkgs.example.com").admits(PUBLIC, 443)  # a name is a name
    rules = Rules.parse(["acme=pypi.org", "acme/web=registry.npmjs.org", "other=x.example.org"])
    assert [str(h) for h in rules.hosts("acme", "web")] == ["pypi.org", "registry.npmjs.org"]
    assert [str(h) for h in rules.hosts("acme", "api")] == ["pypi.org"]
    assert rules.hosts("nobody", "web") == ()


REFUSED = [
    ("other.example.org:443", "not allowed"),
    ("127.0.0.1:{port}", "not allowed"),
    ("10.0.0.1:443", "not allowed"),
    ("169.254.169.254:80", "not allowed"),
    ("[::1]:443", "not allowed"),
    ("[::ffff:127.0.0.1]:443", "not allowed"),
    ("localhost:80", "not allowed"),
    ("loop.example.com:80", "no public address"),
    ("private.example.com:443", "no public address"),
    ("meta.example.com:80", "no public address"),
    ("pkgs.example.com:22", "not allowed"),
]


@pytest.mark.parametrize(("where", "why"), REFUSED)
async def test_connect_to_a_host_not_allowed_or_not_public_is_refused(
    server: Target, tmp_path: Path, where: str, why: str
) -> None:
    where = where.format(port=server.port)
    seen = len(server.seen)
    async with proxy_for(server, tmp_path) as (_, records):
        status, body = await ask(_, f"CONNECT {where} HTTP/1.1\r\nHost: {where}\r\n\r\n".encode())
    assert status.startswith("HTTP/1.1 403"), status
    assert why in body.decode()
    assert [(r.verdict, r.address) for r in records] == [("refused", None)]
    assert why in records[0].reason
    assert len(server.seen) == seen  # nothing reached the target


async def test_an_allowed_host_is_tunnelled_to_its_public_address_only(
    server: Target, tmp_path: Path
) -> None:
    async with proxy_for(server, tmp_path) as (proxy, records):
        for host in ("pkgs.example.com", "mixed.example.com"):  # mixed: 127.0.0.1 skipped
            reader, writer = await asyncio.open_unix_connection(str(proxy.socket))
            writer.write(f"CONNECT {host}:80 HTTP/1.1\r\nHost: {host}:80\r\n\r\n".encode())
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
            writer.write(f"GET /hi HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
            answer = await asyncio.wait_for(reader.read(), 10)
            writer.close()
            assert answer.endswith(f"hello from {host}".encode())

        async def recorded() -> bool:
            return len(records) == 2

        await eventually(recorded, 10, "both connections recorded")
    assert [(r.host, r.address, r.verdict) for r in records] == [
        ("pkgs.example.com", PUBLIC, "allowed"),
        ("mixed.example.com", PUBLIC, "allowed"),
    ]
    assert all(r.sent > 0 and r.received > 0 for r in records)


def fetch(proxy_url: str, url: str) -> tuple[int, bytes]:
    """``url`` through the proxy as a command's Python would (redirects followed)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": proxy_url}))
    try:
        with opener.open(url, timeout=10) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


async def test_a_redirect_to_a_private_host_is_refused_at_its_own_request(
    server: Target, tmp_path: Path
) -> None:
    async with proxy_for(server, tmp_path, tcp=True) as (proxy, records):
        assert proxy.url is not None
        base = "http://redirect.example.com/redirect?to="
        for private in (
            f"http://127.0.0.1:{server.port}/private",
            "http://private.example.com/private",
            "http://loop.example.com/private",
            "http://169.254.169.254/latest/meta-data/",
        ):
            status, body = await asyncio.to_thread(fetch, proxy.url, base + private)
            assert status == 403, (private, status, body)
        status, body = await asyncio.to_thread(fetch, proxy.url, "http://pkgs.example.com/ok")
        assert (status, body) == (200, b"hello from pkgs.example.com")
    assert not [s for s in server.seen if "/private" in s and "redirect" not in s]
    # each connection is recorded when it ends: a redirect's may end after its refused follow-up
    by_host = sorted((r.host, r.verdict) for r in records)
    assert by_host == sorted(
        [("redirect.example.com", "allowed")] * 4
        + [("127.0.0.1", "refused"), ("private.example.com", "refused")]
        + [("loop.example.com", "refused"), ("169.254.169.254", "refused")]
        + [("pkgs.example.com", "allowed")]
    ), by_host


async def test_a_huge_request_head_is_refused(server: Target, tmp_path: Path) -> None:
    async with proxy_for(server, tmp_path) as (proxy, records):
        host = "a" * (64 * 1024) + ".example.com"
        status, _ = await ask(proxy, f"CONNECT {host}:443 HTTP/1.1\r\n\r\n".encode())
        assert status.startswith("HTTP/1.1 431")
        status, _ = await ask(
            proxy, b"GET http://pkgs.example.com/ HTTP/1.1\r\n" + b"X: y\r\n" * 9000
        )
        assert status.startswith("HTTP/1.1 431")
        status, _ = await ask(proxy, b"NONSENSE\r\n\r\n")
        assert status.startswith("HTTP/1.1 400")
        status, _ = await ask(proxy, b"GET https://pkgs.example.com/ HTTP/1.1\r\n\r\n")
        assert status.startswith("HTTP/1.1 400")  # https is tunnelled (CONNECT), never fetched
    assert [r.verdict for r in records] == ["refused"] * 4


async def test_connections_bytes_and_the_credential_are_limited(
    server: Target, tmp_path: Path
) -> None:
    limits = ProxyLimits(connections=1, total_bytes=64 * 1024)
    async with proxy_for(server, tmp_path, limits, tcp=True) as (proxy, records):
        reader, writer = await asyncio.open_unix_connection(str(proxy.socket))
        writer.write(b"CONNECT pkgs.example.com:80 HTTP/1.1\r\n\r\n")
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        status, _ = await ask(proxy, b"CONNECT pkgs.example.com:80 HTTP/1.1\r\n\r\n")
        assert status.startswith("HTTP/1.1 503")  # one at a time
        writer.write(b"GET /big HTTP/1.1\r\nHost: pkgs.example.com\r\n\r\n")
        got = await asyncio.wait_for(reader.read(), 10)  # cut at the command's bytes
        writer.close()
        assert 0 < len(got) <= 64 * 1024 < server.big
        assert proxy.url is not None
        port = proxy.url.rsplit(":", 1)[1]
        r2, w2 = await asyncio.open_connection("127.0.0.1", int(port))
        w2.write(b"CONNECT pkgs.example.com:80 HTTP/1.1\r\n\r\n")  # no credential
        assert (await asyncio.wait_for(r2.read(), 10)).startswith(b"HTTP/1.1 407")
        w2.close()
        wrong = base64.b64encode(b"quill:wrong").decode()
        r3, w3 = await asyncio.open_connection("127.0.0.1", int(port))
        auth = f"Proxy-Authorization: Basic {wrong}"
        w3.write(f"CONNECT pkgs.example.com:80 HTTP/1.1\r\n{auth}\r\n\r\n".encode())
        assert (await asyncio.wait_for(r3.read(), 10)).startswith(b"HTTP/1.1 407")
        w3.close()

        async def recorded() -> bool:
            return len(records) == 4

        await eventually(recorded, 10, "every connection recorded")
    assert sorted(r.reason for r in records if r.verdict == "refused")[0].startswith("more than 1")
    assert any("bytes are used up" in r.reason for r in records)


# ------------------------------------------------------------ through the executor


@pytest.fixture(params=["bwrap", "local"])
def provider(request: pytest.FixtureRequest) -> str:
    if request.param == "bwrap" and WHY_NO_BWRAP is not None:
        pytest.skip(f"bwrap cannot run here: {WHY_NO_BWRAP}")
    return str(request.param)


@pytest_asyncio.fixture
async def executor(
    nats_url: str, tmp_path: Path, provider: str, server: Target
) -> AsyncIterator[Quill]:
    """A writer, a reader and an executor letting acme/allowed-PROVIDER reach the test's
    hosts."""
    async with AsyncExitStack() as es:
        await start_writer(es, nats_url, tmp_path / "w")
        await start_reader(es, nats_url, tmp_path / "r")
        config = ExecutorConfig(
            sandbox=provider,
            egress_allow=(f"acme/allowed-{provider}={','.join(HOSTS)}",),
            egress_policy=policy(server),
        )
        await start_executor(es, nats_url, tmp_path / "x", config)
        quill = Quill(await __import__("nats").connect(nats_url))
        es.push_async_callback(quill.nc.close)
        yield quill


PROBE = """
import json, os, urllib.request
def get(url):
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return [r.status, r.read().decode()]
    except urllib.error.HTTPError as e:
        return [e.code, e.read().decode()[:200]]
    except Exception as e:
        return [0, type(e).__name__]
print(json.dumps({
    "proxy": sorted(k for k in os.environ if "proxy" in k.lower()),
    "socket": os.path.exists("/tmp/.quill-egress"),
    "pkgs": get("http://pkgs.example.com/hi"),
    "loop": get("http://loop.example.com/hi"),
    "redirect": get("http://redirect.example.com/redirect?to=http://10.0.0.1/private"),
}))
"""


async def test_only_an_allowed_workspace_reaches_its_hosts_and_each_connection_is_audited(
    executor: Quill, provider: str
) -> None:
    allowed = executor.workspace(f"acme/allowed-{provider}")
    other = executor.workspace(f"acme/other-{provider}")
    for ws in (allowed, other):
        await ws.create()
    await allowed.write("probe.py", PROBE)
    await other.write("probe.py", PROBE)
    seen = json.loads((await allowed.exec("python3 probe.py", timeout_ms=60_000)).stdout)
    assert seen["pkgs"] == [200, "hello from pkgs.example.com"]
    assert seen["loop"][0] == 403 and "no public address" in seen["loop"][1]
    assert seen["redirect"][0] == 403
    assert "HTTPS_PROXY" in seen["proxy"] and seen["socket"] == (provider == "bwrap")
    denied = json.loads((await other.exec("python3 probe.py", timeout_ms=60_000)).stdout)
    assert denied["proxy"] == [] and denied["socket"] is False  # no proxy, no socket
    assert denied["pkgs"][0] == 0  # and no network

    async def audited() -> list[dict[str, object]]:
        found = []
        async for record in allowed.audit():
            if record.op == "egress" and record.details is not None:
                found.append(record.details)
        return found

    async def three() -> bool:
        return len(await audited()) >= 4

    await eventually(three, 15, "the egress connections audited")
    verdicts = sorted((str(d["host"]), str(d["verdict"])) for d in await audited())
    assert verdicts == [
        ("10.0.0.1", "refused"),
        ("loop.example.com", "refused"),
        ("pkgs.example.com", "allowed"),
        ("redirect.example.com", "allowed"),
    ]
    assert not [r async for r in other.audit() if r.op == "egress"]
