"""Commands' changes honour ``.gitignore`` files as git does (issue 30: a test run committed 22
paths of ``.hypothesis/``): nested files, negations, a directory's own ``*``; what the log holds
stays committed whatever a pattern says; the reply counts what was left out and why; a
workspace option turns it off; a changed ``.gitignore`` changes what is ignored below it.

Every test runs with both providers (bwrap over an overlay: the paths the merge touched;
local: a walk of the tree), over a real nats-server, writer, reader and executor."""

from __future__ import annotations

import pytest

from contracts.limits import LimitsPatch
from quill.client import Quill, Workspace
from tests.executor.conftest import StartExecutor
from tests.helpers import PUT_FILES

# What pytest and hypothesis leave behind, with a project's own .gitignore files.
TOOLS = (
    "python3 - <<'EOF'\n"
    + PUT_FILES
    + """put(".hypothesis/.gitignore", "# ignore everything\\n*\\n")
for i in range(20):
    put(f".hypothesis/examples/{i:02x}/{i}", "example")
put(".hypothesis/unicode_data/14.0.0/charmap.json.gz")
put(".gitignore", "out/\\n*.tmp\\n")
put("out/app.o")
put("pkg/.gitignore", "!keep.tmp\\nlocal/\\n")
put("pkg/a.tmp")
put("pkg/keep.tmp")
put("pkg/local/cache.db")
put("pkg/local.txt")
put("pkg/mod.py", "x = 1\\n")
EOF"""
)


async def _workspace(stack: StartExecutor, quill: Quill, name: str, **limits: object) -> Workspace:
    """An executor started (``stack``) and workspace ``name`` created with ``limits``."""
    await stack()
    ws = quill.workspace(name)
    await ws.create(limits=LimitsPatch(**limits) if limits else None)  # type: ignore[arg-type]
    await ws.write("notes.log", "committed before\n")
    return ws


@pytest.fixture
async def ws(stack: StartExecutor, quill: Quill, name: str) -> Workspace:
    """This test's workspace, the gitignore option as by default (``_workspace``)."""
    return await _workspace(stack, quill, name)


async def test_tool_caches_stay_out_of_history(ws: Workspace) -> None:
    r = await ws.exec(TOOLS)
    assert r.exit_code == 0, r.stderr
    committed = sorted(p.path for p in r.changes.paths)
    assert committed == [".gitignore", "pkg/.gitignore", "pkg/keep.tmp", "pkg/local.txt",
                         "pkg/mod.py"]  # fmt: skip
    assert sorted(r.changes.ignored) == [
        ".hypothesis/.gitignore",
        ".hypothesis/examples",
        ".hypothesis/unicode_data",
        "out",
        "pkg/a.tmp",
        "pkg/local",
    ]
    assert r.changes.ignored_total == 6 and r.changes.ignored_reasons == {"gitignored": 6}
    assert r.changes.warnings == []
    assert not [e async for e in ws.list_all(recursive=True) if e.path.startswith(".hyp")]
    # Still there for the next command; changed again, not reported again.
    again = await ws.exec("cat out/app.o pkg/a.tmp && echo y > .hypothesis/examples/00/0")
    assert again.stdout == "xx" and not again.changes.committed
    assert again.changes.ignored == [] and again.changes.ignored_total == 0


async def test_a_committed_path_stays_committed_whatever_a_pattern_says(ws: Workspace) -> None:
    await ws.write("vendor2/lib.py", "v = 1\n")
    r = await ws.exec(
        "printf '*.log\\nvendor2/\\n' > .gitignore && echo changed >> notes.log && "
        "echo new > new.log && echo v2 > vendor2/lib.py && echo w > vendor2/new.py"
    )
    changed = sorted((p.path, p.change) for p in r.changes.paths)
    assert changed == [
        (".gitignore", "created"),
        ("notes.log", "modified"),
        ("vendor2/lib.py", "modified"),
    ]
    assert sorted(r.changes.ignored) == ["new.log", "vendor2/new.py"]
    assert await ws.read_text("notes.log") == "committed before\nchanged\n"
    gone = await ws.exec("rm notes.log vendor2/lib.py")  # deletions are committed too
    assert sorted(p.path for p in gone.changes.paths) == ["notes.log", "vendor2/lib.py"]


async def test_the_workspace_option_turns_it_off(
    stack: StartExecutor, quill: Quill, name: str
) -> None:
    ws = await _workspace(stack, quill, name, gitignore=False)
    assert (await ws.info()).limits.gitignore is False
    r = await ws.exec(TOOLS)
    paths = {p.path for p in r.changes.paths}
    assert {".hypothesis/examples/00/0", "out/app.o", "pkg/a.tmp"} <= paths
    assert r.changes.ignored == [] and r.changes.ignored_reasons == {}
    quillignored = await ws.exec("mkdir -p node_modules/x && echo 1 > node_modules/x/i.js")
    assert quillignored.changes.ignored_reasons == {"quillignore": 1}  # .quillignore's stand


async def test_a_changed_gitignore_changes_what_is_ignored_below_it(ws: Workspace) -> None:
    await ws.write("sub/keep.py", "k = 1\n")
    first = await ws.exec(
        "printf '*.tmp\\n' > sub/.gitignore && echo a > sub/a.tmp && mkdir -p sub/deep && "
        "echo b > sub/deep/b.tmp && echo c > c.tmp"
    )
    assert sorted(first.changes.ignored) == ["sub/a.tmp", "sub/deep/b.tmp"]
    assert [p.path for p in first.changes.paths] == ["c.tmp", "sub/.gitignore"]
    # sub/deep was made for an ignored file only: not committed (as git keeps no directory)
    assert "sub/deep" not in {e.path async for e in ws.list_all(recursive=True)}
    second = await ws.exec("printf '# none\\n' > sub/.gitignore")
    assert sorted(p.path for p in second.changes.paths) == [
        "sub/.gitignore",
        "sub/a.tmp",
        "sub/deep/b.tmp",
    ]
    third = await ws.exec("printf '*.tmp\\n' > .gitignore && echo c2 > c.tmp && echo d > d.tmp")
    assert sorted(p.path for p in third.changes.paths) == [".gitignore", "c.tmp"]  # tracked
    assert third.changes.ignored == ["d.tmp"]
    fourth = await ws.exec("rm .gitignore")
    assert sorted((p.path, p.change) for p in fourth.changes.paths) == [
        (".gitignore", "deleted"),
        ("d.tmp", "created"),
    ]


async def test_a_repository_inside_is_not_taken_apart(ws: Workspace) -> None:
    """As git, no pattern applies inside ``.git``: a project's ``logs/`` or ``objects/`` line
    leaves a repository's state whole (it is versioned like any file)."""
    r = await ws.exec(
        "printf 'logs/\\nobjects/\\nindex\\n*.pack\\n' > .gitignore && git init -q repo"
        " && cd repo && echo r > r.txt && mkdir logs && echo l > logs/x && git add r.txt"
        " && git -c user.email=a@b.invalid -c user.name=a commit -qm r"
    )
    assert r.exit_code == 0, r.stderr
    committed = {p.path for p in r.changes.paths}
    assert {"repo/.git/index", "repo/.git/logs/HEAD", "repo/r.txt"} <= committed
    assert any(p.startswith("repo/.git/objects/") for p in committed)
    assert r.changes.ignored == ["repo/logs"]
