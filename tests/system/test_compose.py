"""``compose.yaml`` is the deployment ``quill cluster up`` runs: the same processes, commands
and flags, the same partitions; its NATS configurations are what ``quill cluster render``
writes, and every one is valid for the nats-server the tests run."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from quill_cli.commands.cluster import up
from quill_cli.deployment import (
    COMPOSE_DATA,
    COMPOSE_HTTP_PORT,
    COMPOSE_METRICS_PORT,
    COMPOSE_TOKENS,
    Deployment,
)
from quill_cli.natsserver import binary
from services.gateway.access import Tokens

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded = yaml.safe_load((ROOT / "compose.yaml").read_text())
    assert isinstance(loaded, dict)
    return loaded


def _kind(name: str) -> str:
    return name.rsplit("-", 1)[0]


def _deployment(compose: dict[str, Any]) -> Deployment:
    """The deployment compose.yaml describes, from its service names and writer flags."""
    names = list(compose["services"])
    count = {k: sum(_kind(n) == k for n in names) for k in ("nats", "writer", "reader", "executor")}
    command = compose["services"]["writer-1"]["command"]
    partitions = int(command[command.index("--partitions") + 1])
    return Deployment(
        nats=count["nats"],
        writers=count["writer"],
        readers=count["reader"],
        executors=count["executor"],
        partitions=partitions,
    )


def test_same_processes_as_cluster_up(compose: dict[str, Any]) -> None:
    deployment = _deployment(compose)
    assert deployment == Deployment()  # what quill cluster up starts when given no flags
    defaults = {p.name: p.default for p in up.params if isinstance(p, click.Option)}
    for flag in ("nats", "writers", "readers", "executors", "partitions"):
        assert defaults[flag] == getattr(deployment, flag), flag
    assert list(compose["services"]) == [*deployment.nats_names, *deployment.service_names]


def test_same_commands_and_flags(compose: dict[str, Any]) -> None:
    deployment = _deployment(compose)
    for name in deployment.service_names:
        assert compose["services"][name]["command"] == ["quill", *deployment.compose_args(name)]
    assert "--replicas" in deployment.compose_args("reader-1") and deployment.replicas == 3


def test_nats_configs_are_rendered_and_valid(compose: dict[str, Any]) -> None:
    deployment = _deployment(compose)
    configs = deployment.compose_configs()
    assert len(configs) == 3
    for relative, text in configs.items():
        path = ROOT / "deploy" / relative
        assert path.read_text() == text, f"{path} is stale: python -m quill cluster render"
        assert f"{{{{partition({deployment.partitions},1,2)}}}}" in text
        checked = subprocess.run(
            [str(binary()), "-t", "-c", str(path)], capture_output=True, text=True, timeout=30
        )
        assert checked.returncode == 0, checked.stderr
    for name in deployment.nats_names:
        service = compose["services"][name]
        assert service["command"] == ["nats-server", "-c", "/etc/nats/nats.conf"]
        assert f"./deploy/nats/{name}.conf:/etc/nats/nats.conf:ro" in service["volumes"]


def test_volumes_ports_and_order(compose: dict[str, Any]) -> None:
    deployment = _deployment(compose)
    services = compose["services"]
    for name in [*deployment.nats_names, *deployment.service_names[:-1]]:
        assert f"{name}:{COMPOSE_DATA}" in services[name]["volumes"], name
        assert name in compose["volumes"]
    published = [port for n in deployment.nats_names for port in services[n]["ports"]]
    assert published == ["4222:4222", "4223:4222", "4224:4222"]
    assert services["gateway"]["ports"] == [f"{COMPOSE_HTTP_PORT}:{COMPOSE_HTTP_PORT}"]
    healthy = {name: {"condition": "service_healthy"} for name in deployment.nats_names}
    for name in deployment.service_names:
        assert services[name]["depends_on"] == healthy, name


def test_the_gateway_reads_its_tokens_from_a_secret(compose: dict[str, Any]) -> None:
    gateway = compose["services"]["gateway"]
    assert gateway["secrets"] == ["quill-tokens"]
    command = gateway["command"]
    assert command[command.index("--tokens") + 1] == COMPOSE_TOKENS
    assert compose["secrets"]["quill-tokens"] == {"file": "./deploy/tokens.toml"}
    Tokens.load(ROOT / "deploy" / "tokens.example.toml")  # the example is a valid file


def test_every_service_has_a_health_check(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        check = service["healthcheck"]
        assert check["test"] == ["CMD", "quill", "cluster", "health", _kind(name)], name
        assert check["interval"] and check["retries"] >= 1


def test_the_image_installs_quill() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^RUN pip install --no-cache-dir \.", dockerfile, re.M)
    for package in ("contracts", "services", "quill"):
        assert f"COPY {package} ./{package}" in dockerfile


def test_the_documented_render_command_writes_deploy(tmp_path: Path) -> None:
    doc = (ROOT / "docs" / "cluster.md").read_text()
    command = next(line.strip() for line in doc.splitlines() if "quill cluster render" in line)
    argv = shlex.split(command.replace("--out deploy", f"--out {tmp_path}"))
    assert argv[:2] == ["python", "-m"]
    subprocess.run([sys.executable, *argv[1:]], check=True, capture_output=True, timeout=60)
    for path in sorted((ROOT / "deploy" / "nats").iterdir()):
        assert (tmp_path / "nats" / path.name).read_text() == path.read_text()
    assert command in (ROOT / "compose.yaml").read_text()  # its header says the same


def test_every_service_serves_metrics_inside_the_network(compose: dict[str, Any]) -> None:
    """Each service listens for scrapes on every address of its container, on one port, and
    that port is published nowhere (the compose network reaches it; the host does not)."""
    deployment = _deployment(compose)
    for name in deployment.service_names:
        service = compose["services"][name]
        command = service["command"]
        assert command[command.index("--metrics-port") + 1] == str(COMPOSE_METRICS_PORT), name
        assert command[command.index("--metrics-host") + 1] == "0.0.0.0", name
        published = [str(port).split(":")[-1] for port in service.get("ports", [])]
        assert str(COMPOSE_METRICS_PORT) not in published, name


def test_the_scrape_config_names_every_service(compose: dict[str, Any]) -> None:
    """deploy/prometheus-compose.yml scrapes every service of compose.yaml, one job a kind
    (``quill-writer``…, as the alerts say), and nothing else."""
    deployment = _deployment(compose)
    config = yaml.safe_load((ROOT / "deploy" / "prometheus-compose.yml").read_text())
    jobs = {
        job["job_name"]: [t for group in job["static_configs"] for t in group["targets"]]
        for job in config["scrape_configs"]
    }
    wanted: dict[str, list[str]] = {}
    for name in deployment.service_names:
        wanted.setdefault(f"quill-{_kind(name)}", []).append(f"{name}:{COMPOSE_METRICS_PORT}")
    assert jobs == wanted
    assert "deploy/prometheus-compose.yml" in (ROOT / "compose.yaml").read_text()
