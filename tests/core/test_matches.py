"""A refused edit says where an ambiguous oldString occurs, or the text closest to a missing
one and how it differs; the file is never changed."""

from __future__ import annotations

import random
import string

import pytest

from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from core import matches
from core.matches import closest, occurrences
from tests.core.test_decide import Harness

CODE = (
    "import os\n"
    "\n"
    "const port = 3000;\n"
    "const host = 'localhost';\n"
    "\n"
    "def main():\n"
    "    server.listen(port, host)\n"
    "    return 0\n"
)


def _forever() -> float:
    return 60.0


def refused(text: str, old: str) -> QuillError:
    h = Harness()
    h.run(rq.WriteFile(path="f.py", content=text))
    with pytest.raises(QuillError) as info:
        h.run(rq.EditFile(path="f.py", old_string=old, new_string="NEW"))
    assert h.text("f.py") == text  # never applied
    return info.value


def test_multiple_matches_lists_lines_with_excerpts() -> None:
    text = "".join(f"x = {i}\nvalue = 1\n" for i in range(1, 15))
    error = refused(text, "value = 1")
    assert error.code == ErrorCode.MULTIPLE_MATCHES
    assert error.message.startswith(
        "Found multiple matches for oldString. Provide more surrounding lines in oldString "
        "to identify the correct match, or set replace_all to replace every occurrence. "
        "It occurs 14 times in f.py (listed up to line 20; 4 more after it):\n"
        "line 2: value = 1\nline 4: value = 1\n"
    )
    assert error.details["occurrences"] == 14
    listed = error.details["matches"]
    assert [m["line"] for m in listed] == list(range(2, 21, 2))
    assert listed[0] == {"line": 2, "excerpt": "value = 1"}


def test_several_on_one_line_and_across_lines() -> None:
    listed, total = occurrences("a a a\nb\na a\n", "a")
    assert total == 5
    assert listed == [
        {"line": 1, "excerpt": "a a a", "times": 3},
        {"line": 3, "excerpt": "a a", "times": 2},
    ]
    listed, total = occurrences("p\nq\np\nq\n", "p\nq")
    assert listed == [
        {"line": 1, "excerpt": "p", "end_line": 2},
        {"line": 3, "excerpt": "p", "end_line": 4},
    ]


def test_a_long_line_is_cut_around_the_match() -> None:
    line = "x" * 500 + " needle " + "y" * 500
    listed, _ = occurrences(f"{line}\n{line}\n", "needle")
    excerpt = listed[0]["excerpt"]
    assert "needle" in excerpt and len(excerpt) <= matches.EXCERPT_CHARS + 6
    assert excerpt.startswith("...") and excerpt.endswith("...")


@pytest.mark.parametrize(
    ("old", "line", "found", "difference"),
    [
        (
            " def main():",
            6,
            "def main():",
            "differs only in whitespace: oldString starts with 1 space, the file has none "
            "before it (leading whitespace)",
        ),
        (
            "    return 0 ",
            8,
            "return 0",
            "differs only in whitespace: oldString ends with 1 space, the file has none after "
            "it (trailing whitespace)",
        ),
        (
            "const  port = 3000",
            3,
            "const port = 3000",
            "differs only in whitespace: oldString has 'const  port = 3000' where the file has "
            "'const port = 3000' (spacing inside the text)",
        ),
        (
            "DEF MAIN():",
            6,
            "def main():",
            "differs only in letter case: oldString has 'DEF MAIN():' where the file has "
            "'def main():'",
        ),
        (
            "port = 3001",
            3,
            "port = 3000",
            "differs: oldString has 'port = 3001' where the file has 'port = 3000'",
        ),
        (
            "def main():\n    server.listen(port,host)\n    return 1",
            6,
            "def main():\n    server.listen(port, host)\n    return 0",
            "differs: line 2 of oldString is '    server.listen(port,host)' where the file has "
            "'    server.listen(port, host)' (2 lines differ)",
        ),
    ],
)
def test_a_miss_names_the_closest_text(old: str, line: int, found: str, difference: str) -> None:
    error = refused(CODE, old)
    assert error.code == ErrorCode.NO_MATCH
    assert error.message.startswith("oldString not found in content. The closest text in f.py")
    near = error.details["closest"]
    assert (near["line"], near["text"], near["difference"]) == (line, found, difference)
    assert f"({difference}); nothing was changed. The file has there:\n{found}" in error.message


def test_crlf_line_endings_are_named() -> None:
    near, _ = closest("a\r\nb\r\nc\r\n", "a\nb", _forever)
    assert near is not None and near["line"] == 1
    assert "\\r\\n (line endings)" in near["difference"]


def test_nothing_close_says_so() -> None:
    error = refused(CODE, "totally unrelated words")
    assert error.message == (
        "oldString not found in content. Nothing in f.py is close to it: read the file again "
        "and copy the text exactly."
    )
    assert error.details == {"path": "f.py", "closest": None}


def test_a_large_file_is_searched_in_bounded_work() -> None:
    rng = random.Random(7)
    lines = [
        "    " + "".join(rng.choice(string.ascii_letters + " ") for _ in range(rng.randint(10, 70)))
        for _ in range(60_000)
    ]
    text = "\n".join(lines) + "\n"
    near, searched = closest(
        text, lines[55_000][:-2] + "#!", _forever
    )  # found by its pieces, anywhere
    assert near is not None and near["line"] == 55_001 and searched is None
    near, searched = closest(text, "@@ %% ^^ ~~", _forever)  # no piece occurs: a budgeted scan
    assert near is None and searched is not None and 0 < searched < len(lines)
