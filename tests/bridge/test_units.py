"""The bridge's pure parts, without NATS: policy files, questions, the terminal, file
versions, confinement and listing order."""

from __future__ import annotations

import asyncio
import os
import re
import tomllib
from datetime import UTC, datetime
from pathlib import Path

import pytest

from contracts.errors import ErrorCode, QuillError
from core.plan import LIVE
from core.rows import Node
from services.bridge.approvals import Approver, Terminal, printable
from services.bridge.folder import FileVersions, Folder
from services.bridge.policy import Policy, Request
from services.bridge.queries import page
from tests.helpers import eventually

POLICY = """
default = "deny"

[[rule]]
decision = "allow"
ops = ["write", "edit"]
paths = ["notes/**", "*.md"]

[[rule]]
decision = "ask"
ops = ["run"]
commands = ['pytest( -q)?']

[[rule]]
decision = "allow"
paths = ["scratch/**"]
"""


def test_a_policy_decides_by_op_path_and_command() -> None:
    policy = Policy.parse(tomllib.loads(POLICY))
    assert policy.decide(Request("write", ["notes/a/b.txt"])) == "allow"
    assert policy.decide(Request("edit", ["deep/down/README.md"])) == "allow"
    assert policy.decide(Request("write", ["notes/a.txt", "src/x.py"])) == "deny"  # every path
    assert policy.decide(Request("delete", ["notes/a.txt"])) == "deny"
    assert policy.decide(Request("run", [], "pytest -q")) == "ask"
    assert policy.decide(Request("run", [], "pytest -q; rm -rf ~")) == "deny"  # whole command
    assert policy.decide(Request("delete", ["scratch/x"])) == "allow"
    assert policy.decide(Request("run", [], "ls scratch/x")) == "deny"  # paths never match run
    assert Policy().decide(Request("write", ["a"])) == "ask"


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('[[rule]]\ndecision = "maybe"', "Invalid enum value 'maybe'"),
        ('[[rule]]\ndecision = "allow"\nops = ["wirte"]', "unknown op 'wirte'"),
        ('[[rule]]\ndecision = "allow"\ncommands = ["("]', "bad command pattern"),
        ('[[rule]]\ndecision = "allow"\nbogus = 1', "unknown field `bogus`"),
        ("default = 'allow", "cannot read the policy file"),
    ],
)
def test_a_bad_policy_file_is_refused_with_the_reason(
    tmp_path: Path, text: str, error: str
) -> None:
    path = tmp_path / "policy.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=re.escape(error)):
        Policy.load(path)


def test_questions_show_control_characters_escaped() -> None:
    assert printable("ls\r\x1b[2Kok\n\u202e") == "ls\\r\\x1b[2Kok\\n\\u202e"
    assert printable("plain text, ünïcode") == "plain text, ünïcode"


async def test_late_answers_are_not_taken_for_the_next_question(tmp_path: Path) -> None:
    read_end, write_end = os.pipe()
    out = (tmp_path / "out.txt").open("w")
    terminal = Terminal(stdin=read_end, stdout=out)
    terminal.start()
    approver = Approver("restricted", Policy(), terminal, "laptop:/x", timeout_s=0.2)
    with pytest.raises(QuillError) as info:
        await approver.approve(Request("write", ["a"]), "write a", None)
    assert info.value.code == ErrorCode.DENIED  # no answer in time
    os.write(write_end, b"y\n")  # typed too late
    await eventually(lambda: not terminal._lines.empty())
    asking = asyncio.create_task(approver.approve(Request("write", ["b"]), "write b", None))
    await eventually(lambda: "#2" in (tmp_path / "out.txt").read_text())
    assert not asking.done()  # the late "y" was dropped: still asking
    os.write(write_end, b"n\n")
    with pytest.raises(QuillError):
        await asking
    os.close(write_end)  # input ends: nobody can answer any more (at the latest the next
    for _ in range(2):  # question finds out)
        with pytest.raises(QuillError) as info:
            await approver.approve(Request("write", ["c"]), "write c", None)
    assert "terminal input has ended" in info.value.message
    out.close()
    os.close(read_end)


def test_file_versions_count_what_the_bridge_sees_change() -> None:
    versions = FileVersions()
    assert versions.observe("a", (1, 1, 1, 1), 1) == (1, 1)
    assert versions.observe("a", (1, 1, 1, 1), 3) == (1, 1)  # unchanged
    assert versions.observe("a", (2, 2, 2, 1), 4) == (2, 4)  # changed by someone else
    versions.wrote("a", 3, (3, 3, 3, 2), 5)
    assert versions.observe("a", (3, 3, 3, 2), 5) == (3, 5)
    versions.removed("a", 6)
    assert versions.last("a") == 3
    assert versions.observe("a", (3, 3, 3, 2), 7) == (4, 7)  # re-created: continues


def test_a_folder_locates_paths_only_inside_itself(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("a")
    (tmp_path / "in" / "out").symlink_to(tmp_path)
    (tmp_path / "in" / "self").symlink_to("a.txt")
    folder = Folder(tmp_path / "in")
    assert folder.locate("a.txt") == tmp_path / "in" / "a.txt"
    assert folder.locate("self") == tmp_path / "in" / "a.txt"
    with pytest.raises(QuillError) as info:
        folder.locate("out")
    assert info.value.code == ErrorCode.ACCESS_DENIED
    assert folder.locate("out/in/a.txt") == tmp_path / "in" / "a.txt"  # out and back in
    with pytest.raises(QuillError):
        folder.locate_for_change("self")
    assert [n.path for n in folder.walk("", folder.root)] == ["a.txt"]


def _node(path: str, kind: str) -> Node:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    return Node(path, kind, None, 0, None, False, False, at, at, 1, LIVE, None)


def test_pages_follow_the_readers_order() -> None:
    nodes = [_node("b.txt", "f"), _node("z", "d"), _node("a", "d"), _node("a.txt", "f")]
    assert [n.path for n in page(nodes, False, None, 10)] == ["a", "z", "a.txt", "b.txt"]
    assert [n.path for n in page(nodes, False, ("d", "z"), 10)] == ["a.txt", "b.txt"]
    assert [n.path for n in page(nodes, True, ("f", "a.txt"), 2)] == ["b.txt", "z"]
