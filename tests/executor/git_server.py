"""A git smart-HTTP server for tests: ``git http-backend`` (CGI) behind Basic auth, in a thread.

Every request is recorded with its Authorization header (``requests``), so a test can tell
whether a server ever saw a credential. ``/redirect/<path>`` answers 302 to ``redirect_to``.
"""

from __future__ import annotations

import base64
import os
import subprocess
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

GIT = "/usr/bin/git"


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    authorization: str | None


@dataclass
class GitServer:
    root: Path
    """Bare repositories served, by name."""
    username: str = "x-access-token"
    token: str | None = None
    """Required as the Basic password when set (the username must match too)."""
    redirect_to: str | None = None
    requests: list[Seen] = field(default_factory=list)
    _httpd: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        assert self._httpd is not None
        return int(self._httpd.server_address[1])

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def url(self, name: str) -> str:
        return f"http://{self.host}/{name}"

    def create(self, name: str) -> Path:
        """A new bare repository (branch ``main``) that accepts pushes."""
        path = self.root / name
        git(self.root, "init", "-q", "--bare", "-b", "main", str(path))
        git(path, "config", "http.receivepack", "true")
        return path

    def start(self) -> GitServer:
        self.root.mkdir(parents=True, exist_ok=True)
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                server._handle(self)

            def do_POST(self) -> None:
                server._handle(self)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()

    def authorized(self, header: str | None) -> bool:
        if self.token is None:
            return True
        expected = base64.b64encode(f"{self.username}:{self.token}".encode()).decode()
        return header == f"Basic {expected}"

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        auth = h.headers.get("Authorization")
        self.requests.append(Seen(h.command, h.path, auth))
        parts = urlsplit(h.path)
        if self.redirect_to is not None and parts.path.startswith("/redirect/"):
            h.send_response(302)
            h.send_header("Location", self.redirect_to + h.path.removeprefix("/redirect"))
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        if not self.authorized(auth):
            h.send_response(401)
            h.send_header("WWW-Authenticate", 'Basic realm="git"')
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        body = _body(h)
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "GIT_PROJECT_ROOT": str(self.root),
            "GIT_HTTP_EXPORT_ALL": "1",
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": "/dev/null",
            "REQUEST_METHOD": h.command,
            "PATH_INFO": parts.path,
            "QUERY_STRING": parts.query,
            "CONTENT_TYPE": h.headers.get("Content-Type", ""),
            "CONTENT_LENGTH": str(len(body)),
            "REMOTE_ADDR": "127.0.0.1",
            "REMOTE_USER": self.username if self.token is not None else "",
            "HTTP_CONTENT_ENCODING": h.headers.get("Content-Encoding", ""),
            "GIT_PROTOCOL": h.headers.get("Git-Protocol", ""),
        }
        cgi = subprocess.run(
            [GIT, "http-backend"], input=body, capture_output=True, env=env, check=False
        )
        head, _, payload = cgi.stdout.partition(b"\r\n\r\n")
        if not _:
            head, _, payload = cgi.stdout.partition(b"\n\n")
        status = 200
        headers: list[tuple[str, str]] = []
        for line in head.decode("latin-1").splitlines():
            name, _, value = line.partition(":")
            if name.lower() == "status":
                status = int(value.split()[0])
            elif name:
                headers.append((name, value.strip()))
        h.send_response(status)
        for name, value in headers:
            h.send_header(name, value)
        h.send_header("Content-Length", str(len(payload)))
        h.end_headers()
        h.wfile.write(payload)


def _body(h: BaseHTTPRequestHandler) -> bytes:
    if h.headers.get("Transfer-Encoding", "").lower() == "chunked":
        chunks: list[bytes] = []
        while True:
            size = int(h.rfile.readline().split(b";")[0].strip(), 16)
            if size == 0:
                h.rfile.readline()
                return b"".join(chunks)
            chunks.append(h.rfile.read(size))
            h.rfile.readline()
    return h.rfile.read(int(h.headers.get("Content-Length", "0")))


def git(cwd: Path, *args: str) -> str:
    """Run git on the host, for test setup only (never on a workspace under test)."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(cwd),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_AUTHOR_NAME": "Server",
        "GIT_AUTHOR_EMAIL": "server@example.invalid",
        "GIT_COMMITTER_NAME": "Server",
        "GIT_COMMITTER_EMAIL": "server@example.invalid",
    }
    out = subprocess.run([GIT, *args], cwd=cwd, env=env, capture_output=True, text=True, check=True)
    return out.stdout
