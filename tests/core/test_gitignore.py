"""``core.gitignore``: what git ignores, decided as git decides it (checked against ``git
ls-files --others --exclude-standard`` on generated trees), in time linear in the path."""

from __future__ import annotations

import random
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from core.gitignore import MAX_FILE_BYTES, Gitignores, IgnoreFile, Unusable


def rules(files: dict[str, str]) -> Gitignores:
    """``Gitignores`` over ``.gitignore`` texts by directory (``""``: the root)."""
    return Gitignores(lambda d: IgnoreFile(files[d].encode()) if d in files else None)


def test_nested_files_negations_and_directories() -> None:
    git = rules(
        {
            "": "*.log\n!keep.log\nbuild/\n/top.txt\ndocs/*.md\n!docs/README.md\n",
            ".hypothesis": "*\n",
            "sub": "!*.log\nlocal/\n",
            "build": "!*\n",  # inside an ignored directory: never read by git
        }
    )
    assert git.ignored("a.log", False) and git.ignored("x/y/a.log", False)
    assert not git.ignored("keep.log", False)  # a later negation
    assert not git.ignored("sub/a.log", False)  # a deeper file overrides
    assert git.ignored("sub/local", True) and not git.ignored("sub/local", False)  # dirs only
    assert git.ignored("build/out.o", False)  # below an ignored directory: not re-included
    assert git.ignored("top.txt", False) and not git.ignored("x/top.txt", False)  # anchored
    assert git.ignored("docs/a.md", False) and not git.ignored("docs/README.md", False)
    assert git.ignored(".hypothesis/.gitignore", False)  # its own '*' ignores it too
    assert git.ignored(".hypothesis/examples", True)
    assert not git.ignored(".hypothesis", True)  # its .gitignore is read: it is not ignored
    assert not git.ignored("src/app.py", False)


def test_a_line_git_skips_is_skipped_and_escapes_hold() -> None:
    git = rules({"": "a\\\n\\#hash\n\\!bang\nspace\\ \n[z-a]\n# comment\n\n"})
    assert git.ignored("#hash", False) and git.ignored("!bang", False)
    assert git.ignored("space ", False) and not git.ignored("space", False)
    assert not git.ignored("a", False)  # 'a\' is not a pattern


def test_globstar_directory_lines_are_what_git_makes_of_them() -> None:
    git = rules({"": "a/**/\n"})  # the directories below a, not a itself
    assert not git.ignored("a", True) and not git.ignored("a/file", False)
    assert git.ignored("a/b", True) and git.ignored("a/b/file", False)


def test_a_file_over_the_limit_is_refused() -> None:
    with pytest.raises(Unusable):
        IgnoreFile(b"x\n" * (MAX_FILE_BYTES // 2 + 1))
    assert len(IgnoreFile(b"same\n" * 1000 + b"!same\n")) == 1  # one entry per line met
    assert rules({"": "same\n" * 1000 + "!same\n"}).ignored("same", False) is False


PATTERNS = [
    "*", "*.log", "!*.log", "a", "a/", "/a", "b/", "!b/", "a/b", "a/**", "a/**/", "**/c",
    "**/c/", "c/**/d", "!keep*", "!a/", "*/", "/*", "!/b", "d", "!d", "x/*", "!x/y", "**",
    "**/", "a/*/", "*.txt", "!important.txt", "[ab]", "?", "!c", "d/**/e", "/x/", "e*", "!e1",
]  # fmt: skip
NAMES = ["a", "b", "c", "d", "e1", "x", "y", "keep1", "f.log", "important.txt", "n.txt"]


def _tree(rng: random.Random) -> tuple[set[str], dict[str, str]]:
    """Files (no path both a file and a directory) and ``.gitignore`` texts by directory."""
    files: set[str] = set()
    for _ in range(rng.randint(3, 14)):
        path = "/".join(rng.choice(NAMES) for _ in range(rng.randint(1, 4)))
        if not any(f.startswith(path + "/") or path.startswith(f + "/") for f in files):
            files.add(path)
    dirs = {"/".join(f.split("/")[:i]) for f in files for i in range(1, f.count("/") + 1)}
    texts = {
        d: "\n".join(rng.choice(PATTERNS) for _ in range(rng.randint(1, 4))) + "\n"
        for d in ["", *sorted(dirs)]
        if rng.random() < (0.8 if d == "" else 0.3)
    }
    return files, texts


def _compare_with_git(tmp_path: Path, trees: int, seed: int) -> None:
    if shutil.which("git") is None:
        print("skipped: no git here to compare with")
        pytest.skip("no git here to compare with")
    rng = random.Random(seed)
    for n in range(trees):
        files, texts = _tree(rng)
        root = tmp_path / f"t{n}"
        subprocess.run(["git", "init", "-q", str(root)], check=True)
        for f in files:
            (root / f).parent.mkdir(parents=True, exist_ok=True)
            (root / f).write_text("x")
        for d, text in texts.items():
            (root / d).mkdir(parents=True, exist_ok=True)
            (root / d / ".gitignore").write_text(text)
        listed = subprocess.run(
            ["git", "-C", str(root), "ls-files", "-o", "--exclude-standard", "-z"],
            capture_output=True,
            check=True,
        ).stdout.decode()
        git_keeps = {p for p in listed.split("\0") if p}
        every = files | {f"{d}/.gitignore" if d else ".gitignore" for d in texts}
        ours = rules(texts)
        assert {p for p in every if not ours.ignored(p, False)} == git_keeps, texts
        shutil.rmtree(root)


def test_the_same_paths_as_git(tmp_path: Path) -> None:
    _compare_with_git(tmp_path, 40, 1)


@pytest.mark.slow
def test_the_same_paths_as_git_on_many_trees(tmp_path: Path) -> None:
    _compare_with_git(tmp_path, 600, 2)


def test_matching_takes_time_linear_in_the_path() -> None:
    """A backtracking translation of these lines (pathspec's ``simple`` backend, Python's
    ``re``) took 1.3 s for one 160-character path: each character of a longer path costs
    about what one of a shorter path did."""
    compiled = IgnoreFile(b"**/a*/**/a*/**/a*/**/a*/**/b\n!**/a*/**/a*/**/a*/**/c\n")
    short, long = "a/" * 10 + "c", "a/" * 500 + "c"

    def cost(path: str) -> float:
        began = time.perf_counter()
        for _ in range(200):
            compiled.decide(path, False)
        return (time.perf_counter() - began) / len(path)

    cost(short)  # warm
    assert cost(long) < 20 * cost(short)
    assert compiled.decide("a/" * 500 + "b", False) is True
