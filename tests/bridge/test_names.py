"""A bridged folder keeps the one name rule (``contracts.paths``): what a command makes with a
name that is not a workspace name (not UTF-8, a newline, bidi, not NFC) is reported in
``changes.skipped``, escaped, with the reason, not among the changes; the next command works;
requests naming such paths get the server's ``INVALID_ARGUMENT``."""

from __future__ import annotations

from pathlib import Path

import pytest

from contracts.errors import ErrorCode, QuillError
from quill.client import Quill
from tests.bridge.conftest import Attach


async def test_names_a_command_makes_that_break_the_rule_are_skipped(
    servers: None, attach: Attach, client: Quill, tmp_path: Path
) -> None:
    folder = tmp_path / "folder"
    folder.mkdir()
    await attach(folder, "names", "--trust", "full")
    ws = client.workspace("acme/names")
    command = (
        "printf x > $'bad\\xff.txt'; printf x > $'new\\nline.txt'; "
        "printf x > $'evil\\xe2\\x80\\xaetxt.md'; printf x > $'cafe\\xcc\\x81.txt'; "
        "mkdir $'dir\\xff' && printf y > $'dir\\xff/in.txt'; printf ok > ok.txt"
    )
    result = await ws.exec(command)
    assert result.exit_code == 0, result.stderr
    assert [(c.path, c.change) for c in result.changes.paths] == [("ok.txt", "created")]
    skipped = {s.path: s.reason for s in result.changes.skipped}
    assert skipped == {
        "bad\\xff.txt": "invalid name: not valid UTF-8 (byte 0xFF): not shown",
        "dir\\xff": "invalid name: not valid UTF-8 (byte 0xFF): not shown",
        "new\\nline.txt": "invalid name: U+000A is a control character: not shown",
        "evil\\u202etxt.md": skipped.get("evil\\u202etxt.md", "missing"),
        "cafe\u0301.txt": skipped.get("cafe\u0301.txt", "missing"),
    }
    assert "U+202E RIGHT-TO-LEFT OVERRIDE" in skipped["evil\\u202etxt.md"]
    assert "not in Unicode NFC" in skipped["cafe\u0301.txt"]

    later = await ws.exec("printf later > later.txt")
    assert [c.path for c in later.changes.paths] == ["later.txt"]
    assert later.changes.skipped == []  # unchanged since: not reported again
    listed = [e.path for e in (await ws.list("", recursive=True)).entries]
    assert listed == ["later.txt", "ok.txt"]

    for path, says in [("evil\u202etxt.md", "U+202E"), ("cafe\u0301.txt", "NFC"), ("d/", "dir")]:
        with pytest.raises(QuillError) as info:
            await ws.write(path, "x")
        assert info.value.code == ErrorCode.INVALID_ARGUMENT and says in info.value.message
    assert not (folder / "d").exists()
