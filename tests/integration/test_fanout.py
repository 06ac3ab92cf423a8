"""docs/agents.md's "Fan out and merge" example as written (issue 33), through a real writer
and reader: four agents fork one workspace, a reviewer dry-runs each merge, merges the clean
ones and settles the conflicting one with markers; then the same over the CLI. The page's
code blocks are run, so the page stays true."""

from __future__ import annotations

import json
import re
from pathlib import Path
from textwrap import indent

import pytest

from contracts import replies as rp
from quill.client import Quill
from tests.conftest import StartReader
from tests.helpers import eventually
from tests.integration.test_replay import quill_in_process

PAGE = Path(__file__).resolve().parents[2] / "docs" / "agents.md"


def section() -> tuple[list[str], list[str]]:
    """The python and the bash blocks of the page's "Fan out and merge" section."""
    text = PAGE.read_text().split("## Fan out and merge", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", text, re.S), re.findall(
        r"```bash\n(.*?)```", text, re.S
    )


async def test_the_fan_out_example_runs_as_written(
    services: StartReader, quill: Quill, nats_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    await services("r1")
    (app, fan_out, settle), (cli,) = section()
    main = quill.workspace("acme/app")
    await main.create()
    await main.write("app.py", app)
    body = indent(f"{fan_out}\n{settle}\nreturn conflicting, marked, text", "    ")
    scope: dict[str, object] = {}
    exec(compile(f"async def example(quill):\n{body}", "agents.md", "exec"), scope)
    conflicting, marked, text = await scope["example"](quill)  # type: ignore[operator]

    printed = capsys.readouterr().out.splitlines()
    assert printed[:3] == [
        "try-1 [('app.py', 'theirs')]",
        "try-2 [('test_app.py', 'theirs')]",
        "try-3 [('app.py', 'merged')]",
    ]
    ((late, conflicts),) = conflicting
    assert late.name == "try-4" and [(c.path, c.kind) for c in conflicts] == [("app.py", "content")]
    assert printed[3] == repr(
        [
            (
                "app.py",
                "content",
                '    return [f.strip() for f in line.split(",")]\n',
                '    return line.rstrip("\\n").split(",")\n',
            )
        ]
    )
    assert isinstance(marked, rp.Merged) and marked.committed
    # the markers as the page names them
    named = re.search(r"The markers are git's \((.*?)\)", PAGE.read_text(), re.S)
    assert named is not None
    for marker in re.findall(r"`([^`]+)`", named.group(1)):
        assert f"\n{marker}\n" in str(text), (marker, text)
    final = app.replace(
        'return line.split(",")', 'return [f.strip() for f in line.rstrip("\\n").split(",")]'
    )
    final = final.replace('return " | ".join(fields)', 'return " | ".join(fields) + "\\n"')
    assert await main.read_text("app.py") == final
    assert "def test_parse" in await main.read_text("test_app.py")
    ops = [e.op for e in (await main.events()).events]
    assert ops[2:] == ["merge", "merge", "merge", "merge", "write"], ops

    out = []
    for line in cli.strip().splitlines():
        if line.startswith("quill forks"):  # once the reader has the edit before it

            async def counted(line: str = line) -> str | None:
                listing = await quill_in_process(line, nats_url)
                return listing if listing.splitlines()[-1].split()[2] == "1" else None

            out.append(await eventually(counted, what="try-5 one version ahead"))
        else:
            out.append(await quill_in_process(line, nats_url))
    assert out[0].startswith(f"forked acme/app at version {main.last_version} as acme/try-5")
    listing = out[2].splitlines()
    assert listing[0].split() == ["FORK", "AT", "AHEAD", "BEHIND"]
    rows = [row.split() for row in listing[1:]]
    assert [r[0] for r in rows] == [f"try-{n}" for n in range(1, 6)]
    assert rows[0][1:] == ["2", "1", "5"] and rows[4][1:] == ["7", "1", "0"]  # at, ahead, behind
    dry, done = json.loads(out[3]), json.loads(out[4])
    assert (dry["committed"], dry["dry_run"], dry["conflicts"]) == (False, True, [])
    assert done["committed"] and [c["path"] for c in done["changes"]] == ["app.py"]
    main.last_version += 1  # the merge is one event: a read waits for the reader to apply it
    assert (await main.read_text("app.py")).startswith('"""A tiny CSV tool, with tests."""')
