"""The ``quill`` CLI split into command modules (``quill_cli/commands/``): every module's
commands are offered by ``quill``, and a bad option or file is refused before anything runs,
as one line ``quill: ...`` and exit status 2, whichever module the command lives in."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import pytest
from click.testing import CliRunner

import quill_cli.commands
from quill_cli.cli import GROUPS, main
from quill_cli.common import Commands


def test_every_command_module_is_offered_by_quill() -> None:
    found = [
        importlib.import_module(f"quill_cli.commands.{m.name}")
        for m in pkgutil.iter_modules(quill_cli.commands.__path__)
    ]
    assert {m.__name__ for m in found} == {m.__name__ for m in GROUPS}
    for module in found:
        assert isinstance(module.commands, Commands), module.__name__
        assert module.commands.commands, module.__name__
        for name, command in module.commands.commands.items():
            assert main.commands[name] is command, (module.__name__, name)


def test_quill_offers_each_command_once() -> None:
    names = [n for m in GROUPS for n in m.commands.commands]
    assert len(names) == len(set(names)) == len(main.commands)


@pytest.fixture
def tmp(tmp_path: Path) -> Path:
    (tmp_path / "dir").mkdir()
    (tmp_path / "bad.toml").write_text("this is = = not toml\n")
    return tmp_path


REFUSED = [
    (["writer", "--data", "{tmp}/d", "--partitions", "-1"], "--partitions must be >= 0"),
    (["writer", "--data", "{tmp}/d", "--lease-ttl", "1"], "--lease-ttl >= 2"),
    (["executor", "--data", "{tmp}/d", "--git-allow", "not a host!"], ""),
    (["gateway", "--tokens", "{tmp}/bad.toml"], ""),
    (["up", "--tenants", "{tmp}/t.toml", "--tokens", "{tmp}/k.toml"], "drop --tokens"),
    (["up", "--tenants", "{tmp}/t.toml", "--nats-url", "nats://x"], "quill nats-auth"),
    (["up", "--secrets", "{tmp}/missing.toml"], "cannot read secrets file"),
    (["attach", "{tmp}/dir", "--as", "w", "--policy", "{tmp}/bad.toml"], "policy file"),
    (["cluster", "up", "--nats", "0"], "at least 1 NATS server"),
    (["cluster", "render", "--partitions", "0"], "--partitions must be at least 1"),
    (["nats-auth", "{tmp}/t.toml"], "set QUILL_NATS_PASSWORD"),
]


@pytest.mark.parametrize(("args", "says"), REFUSED, ids=[" ".join(a[:2]) for a, _ in REFUSED])
def test_a_bad_option_or_file_is_one_line_and_exit_2(
    tmp: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], says: str
) -> None:
    monkeypatch.delenv("QUILL_NATS_PASSWORD", raising=False)
    result = CliRunner().invoke(main, [a.format(tmp=tmp) for a in args])
    assert result.exit_code == 2, (result.output, result.exception)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("quill: "), result.stderr
    assert says in lines[0]


def test_scrub_with_an_unreadable_secrets_file_is_one_line_and_exit_2(tmp: Path) -> None:
    """Refused before connecting: ``quill: INVALID_ARGUMENT: --secrets: ...``, no traceback."""
    result = CliRunner().invoke(main, ["scrub", "a/b", "--secrets", f"{tmp}/missing.toml"])
    assert result.exit_code == 2, (result.output, result.exception)
    assert result.stderr.startswith("quill: INVALID_ARGUMENT: --secrets: "), result.stderr
    assert len(result.stderr.splitlines()) == 1
