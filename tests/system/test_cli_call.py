"""``quill call``: any op by its key, its request as JSON, against a real ``quill up``."""

from __future__ import annotations

import json

from contracts import ops
from tests.up import Up


def test_any_op_by_its_key_with_a_json_body(up: Up) -> None:
    up.cli("create", "acme/call", "--exist-ok")
    written = up.cli("call", "acme/call", "cmd.write", '{"path": "a.txt", "content": "hi\\n"}')
    assert json.loads(written.stdout)["committed"] is True
    read = up.cli("call", "acme/call", "read", "-", input='{"path": "a.txt"}')  # name alone
    assert json.loads(read.stdout)["content"] == "hi\n"
    ran = up.cli("call", "acme/call", "exec.run", '{"command": "cat a.txt"}')
    assert json.loads(ran.stdout)["stdout"] == "hi\n"
    assert up.cli("cat", "acme/call", "a.txt").stdout == "hi\n"


def test_every_op_is_listed(up: Up) -> None:
    listed = up.cli("call", "--list").stdout.split("\n")
    assert {line.split()[0] for line in listed if line} == set(ops.OPS)


def test_a_bad_op_or_body_is_one_line_and_exit_2_before_sending(up: Up) -> None:
    unknown = up.cli("call", "acme/call", "frobnicate", check=False)
    assert unknown.returncode == 2
    assert unknown.stderr.startswith("quill: INVALID_ARGUMENT: Unknown op 'frobnicate'")
    ambiguous = up.cli("call", "acme/call", "run", check=False)
    assert ambiguous.returncode == 2 and "qry.run, exec.run" in ambiguous.stderr
    for body in ('{"path": 7}', "not json", '{"path": "a.txt", "extra": 1}'):
        bad = up.cli("call", "acme/call", "cmd.write", body, check=False)
        assert bad.returncode == 2, body
        assert bad.stderr.count("\n") == 1 and "INVALID_ARGUMENT" in bad.stderr, bad.stderr
