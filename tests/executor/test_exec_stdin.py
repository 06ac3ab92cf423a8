"""A command's standard input (``exec.run``'s ``stdin``), under both sandbox providers: fed
whole to the command, bytes as they are; without it, stdin is closed and a read of it is told,
as before. (Its bounds and its privacy: ``tests/security/test_exec_stdin.py``.)"""

from __future__ import annotations

from contracts.limits import EXEC_STDIN_MAX_BYTES
from quill.workspace import Workspace


async def test_the_command_reads_what_it_is_given(ws: Workspace) -> None:
    r = await ws.exec("tr a-z A-Z", stdin=b"shout\n")
    assert (r.stdout, r.exit_code, r.stdin_read) == ("SHOUT\n", 0, False)
    raw = bytes(range(256)) * 3
    kept = await ws.exec("cat > fed.bin", stdin=raw)  # bytes as they are (base64 on the wire)
    assert kept.changes.committed and await ws.read_bytes("fed.bin") == raw
    whole = await ws.exec("wc -c", stdin=b"x" * EXEC_STDIN_MAX_BYTES)  # the limit itself
    assert whole.stdout.strip() == str(EXEC_STDIN_MAX_BYTES)
    empty = await ws.exec("cat; echo end", stdin=b"")  # given empty: end of file, no note
    assert (empty.stdout, empty.stdin_read) == ("end\n", False)
    closed = await ws.exec('read x; echo "[$x]"')  # none given: closed, and the read told
    assert (closed.stdout, closed.stdin_read) == ("[]\n", True)
