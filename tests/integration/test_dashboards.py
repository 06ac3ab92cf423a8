"""The Grafana dashboard (``deploy/grafana/quill.json``) and the alert rules
(``deploy/prometheus/quill-rules.yml``) use only metrics a running stack exports.

A writer, a reader, an executor and a gateway run as processes (``quill writer --metrics-port``
…) against a real nats-server; every ``quill_*`` and ``process_*`` name the two files use must
be declared (``# TYPE``) by one of their scrapes. The rules are checked by ``promtool`` where it
is installed (Debian: ``apt-get install prometheus``), else for their structure; the
dashboard's expressions go through ``promtool`` as recording rules.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
import yaml

from quill_cli.ports import free_port
from tests.helpers import eventually
from tests.metrics_scrape import Scrape

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy/grafana/quill.json"
RULES = ROOT / "deploy/prometheus/quill-rules.yml"

_NAME = re.compile(r"\b((?:quill|process)_[a-z0-9_]+)")
_SUFFIX = re.compile(r"_(bucket|count|sum)$")


def used(expr: str) -> set[str]:
    """The families an expression reads (a histogram's ``_bucket`` is its family)."""
    return {_SUFFIX.sub("", name) for name in _NAME.findall(expr)}


def dashboard_exprs() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [t["expr"] for p in panels for t in p.get("targets", [])]


def rules() -> list[dict[str, Any]]:
    return [
        rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]
    ]


def test_the_rules_are_alerts_with_a_severity_and_a_summary() -> None:
    doc = yaml.safe_load(RULES.read_text())
    assert set(doc) == {"groups"}
    names = set()
    for group in doc["groups"]:
        assert group["name"] and group["rules"]
        for rule in group["rules"]:
            assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
            assert rule["alert"] not in names
            names.add(rule["alert"])
            assert isinstance(rule["expr"], str), rule
            assert re.fullmatch(r"\d+[smh]", rule.get("for", "0s")), rule
            assert rule["labels"]["severity"] in ("page", "ticket"), rule
            assert rule["annotations"]["summary"], rule
    for alert in ("QuillReaderLag", "QuillWriterQueue", "QuillPublishFailures"):
        assert alert in names
    assert {"QuillStorageFull", "QuillBusyRejections"} <= names


def documented_alerts() -> dict[str, str]:
    """docs/operations.md's "### Alerts" table: each row's expression (those on metrics)."""
    section = (ROOT / "docs/operations.md").read_text().split("### Alerts", 1)[1]
    section = section.split("\n## ", 1)[0]
    out = {}
    for line in section.splitlines():
        cells = line.split(" | ")
        if not line.startswith("| ") or len(cells) < 3 or "`" not in cells[1]:
            continue
        expr = cells[1].replace("\\|", "|").split("`")[1]
        if "quill_" in expr or "up{" in expr:
            out[cells[0].removeprefix("| ")] = expr
    return out


def test_the_rules_are_the_documented_alerts() -> None:
    def same(expr: str) -> str:
        return re.sub(r"\s+", "", expr)

    exprs = {same(rule["expr"]) for rule in rules()}
    documented = documented_alerts()
    assert len(documented) >= 15
    missing = {name: e for name, e in documented.items() if same(e) not in exprs}
    assert not missing, f"in docs/operations.md, not in {RULES.name}: {missing}"
    assert len(exprs) == len(documented)


def test_the_dashboard_has_a_panel_per_area() -> None:
    doc = json.loads(DASHBOARD.read_text())
    assert doc["uid"] == "quill"
    rows = [p["title"] for p in doc["panels"] if p["type"] == "row"]
    assert rows == ["Requests", "Writer", "Reader", "Executor", "Storage and publishing",
                    "Processes"]  # fmt: skip
    for panel in doc["panels"]:
        if panel["type"] != "row":
            assert panel["targets"] and panel["datasource"]["uid"] == "${datasource}", panel


def test_promtool_accepts_the_rules_and_the_dashboards_expressions(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (apt-get install prometheus): structure only")
    checked = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True)
    assert checked.returncode == 0, checked.stdout.decode() + checked.stderr.decode()
    recording = [
        {"record": f"quill:dashboard:{i}", "expr": expr.replace("$__rate_interval", "5m")}
        for i, expr in enumerate(dashboard_exprs())
    ]
    as_rules = tmp_path / "dashboard-rules.yml"
    as_rules.write_text(yaml.safe_dump({"groups": [{"name": "d", "rules": recording}]}))
    checked = subprocess.run([promtool, "check", "rules", str(as_rules)], capture_output=True)
    assert checked.returncode == 0, checked.stdout.decode() + checked.stderr.decode()


@pytest_asyncio.fixture
async def scrapes(nats_url: str, tmp_path: Path) -> AsyncIterator[list[str]]:
    """The metrics URLs of a writer, a reader, an executor and a gateway, each a process."""
    ports = [free_port() for _ in range(4)]
    runs = [
        [s, "--data", str(tmp_path / s), "--metrics-port", str(port)]
        for s, port in zip(("writer", "reader", "executor"), ports, strict=False)
    ]
    runs[2] += ["--sandbox", "local"]
    runs.append(["gateway", "--http-port", str(ports[3]), "--workers", "1"])
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "quill",
            *run,
            "--nats-url",
            nats_url,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        for run in runs
    ]
    try:
        yield [f"http://127.0.0.1:{port}/metrics" for port in ports]
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.terminate()
            await proc.wait()


async def test_every_metric_they_use_is_exported_by_a_running_stack(scrapes: list[str]) -> None:
    exprs = dashboard_exprs() + [rule["expr"] for rule in rules()]
    wanted = set().union(*map(used, exprs))
    assert {"quill_reader_lag_seconds", "process_cpu_seconds_total"} <= wanted
    missing = set(wanted)
    async with httpx.AsyncClient() as http:

        async def all_exported() -> bool:  # once every process serves its scrape
            nonlocal missing
            for url in scrapes:
                with contextlib.suppress(httpx.TransportError):  # not listening yet
                    missing -= Scrape.parse((await http.get(url)).text).declared
            return not missing

        with contextlib.suppress(AssertionError):  # then the assertion says what is missing
            await eventually(all_exported, 60)
    assert not missing, f"used, not exported: {sorted(missing)}"
