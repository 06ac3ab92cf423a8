"""The gateway's request metrics under a hostile client: whatever methods and paths it sends,
the label values stay a bounded set (a series per value a client chooses would grow the
gateway's memory and every scrape without bound)."""

from __future__ import annotations

import uuid

import httpx

from tests.metrics_scrape import Scrape

ODD_METHODS = ["PROPFIND", "MKCOL", "PURGE", "REPORT", "UNLOCK"]
"""Methods the HTTP parser lets through (it refuses invented ones) that no route serves."""


async def test_odd_methods_and_invented_paths_add_no_label_values(
    http: httpx.AsyncClient,
) -> None:
    before = Scrape.parse((await http.get("/metrics")).text)
    paths = [uuid.uuid4().hex for _ in ODD_METHODS]
    for method, path in zip(ODD_METHODS, paths, strict=True):
        await http.request(method, f"/{path}/x")  # neither the method nor the path served
        await http.request(method, "/v1/host/workspace/files/a.txt")  # a route, not its method
        await http.get(f"/no-such-route/{path}")
    after = Scrape.parse((await http.get("/metrics")).text)
    assert not [word for word in ODD_METHODS + paths if word in after.text]
    total, gateway = "quill_requests_total", {"service": "gateway", "kind": "http"}
    assert after.grew(before, total, op="OTHER unmatched", **gateway) == 5
    assert after.grew(before, total, op="OTHER /v1/host/workspace/files/{path}", **gateway) == 5
    assert after.grew(before, total, op="GET unmatched", **gateway) == 5
