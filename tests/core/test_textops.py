"""edit and modify semantics, checked against plain Python string operations."""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from core.content import split_lines
from core.textops import modify_lines, regex_replace
from tests.core.test_decide import Harness

_text = st.text(alphabet="ab\n$1\\", max_size=40)


def _second() -> float:
    """A constant budget: each search may take a second."""
    return 1.0


def _file(h: Harness, text: str) -> None:
    h.run(rq.WriteFile(path="f.txt", content=text))


@given(_text, st.text(alphabet="ab\n", min_size=1, max_size=4), _text, st.booleans())
def test_edit_is_str_replace(text: str, old: str, new: str, everywhere: bool) -> None:
    assume(old != new)
    h = Harness()
    _file(h, text)
    occurrences = [i for i in range(len(text)) if text.startswith(old, i)]
    try:
        h.run(rq.EditFile(path="f.txt", old_string=old, new_string=new, replace_all=everywhere))
    except QuillError as exc:
        if not occurrences:
            assert exc.code == ErrorCode.NO_MATCH
            assert exc.message.startswith("oldString not found in content")
        else:
            assert exc.code == ErrorCode.MULTIPLE_MATCHES and not everywhere
            assert exc.message.startswith("Found multiple matches for oldString")
        assert h.text("f.txt") == text
        return
    expected = text.replace(old, new) if everywhere else text.replace(old, new, 1)
    assert h.text("f.txt") == expected  # literal: "$1" and "\\1" stay as they are


def test_edit_refusals_and_result() -> None:
    h = Harness()
    _file(h, "port = 3000\nhost = x\n")
    h.fails(rq.EditFile(path="f.txt", old_string="x", new_string="x"), ErrorCode.INVALID_ARGUMENT)
    h.fails(rq.EditFile(path="nope", old_string="a", new_string="b"), ErrorCode.FILE_NOT_FOUND)
    h.run(rq.WriteFile(path="bin", data=b"\x00\xff"))
    h.fails(rq.EditFile(path="bin", old_string="a", new_string="b"), ErrorCode.INVALID_ENCODING)
    d = h.run(rq.EditFile(path="f.txt", old_string="3000", new_string="8080"))
    assert d.result.replacements == 1 and d.result.lines_changed == 1  # type: ignore[attr-defined]
    assert h.text("f.txt") == "port = 8080\nhost = x\n"


_line_op = st.one_of(
    st.builds(
        rq.ReplaceLines,
        start_line=st.integers(1, 6),
        end_line=st.integers(1, 6),
        new_content=st.sampled_from(["", "X", "X\nY\n"]),
    ),
    st.builds(rq.DeleteLines, start_line=st.integers(1, 6), end_line=st.integers(1, 6)),
    st.builds(
        rq.InsertLines, after_line=st.integers(0, 6), new_content=st.sampled_from(["I\n", "J"])
    ),
)


def _reference(lines: list[str], ops: list) -> list[str] | None:  # type: ignore[type-arg]
    """Plain list operations, bottom-up in original numbering; None where modify must refuse."""
    n = len(lines)
    ranges = sorted(
        (op.start_line, op.end_line) for op in ops if not isinstance(op, rq.InsertLines)
    )
    if any(s > e or e > n for s, e in ranges) or any(
        s2 <= e1 for (_, e1), (s2, _) in zip(ranges, ranges[1:], strict=False)
    ):
        return None
    for op in ops:
        if isinstance(op, rq.InsertLines) and (
            op.after_line > n or any(s <= op.after_line < e for s, e in ranges)
        ):
            return None
    block = lambda c: [x + "\n" for x in c.removesuffix("\n").split("\n")] if c else []  # noqa: E731
    out = [line if line.endswith("\n") else line + "\n" for line in lines]
    by_position = sorted(
        enumerate(ops),
        key=lambda e: (
            -(e[1].after_line if isinstance(e[1], rq.InsertLines) else e[1].start_line - 1),
            isinstance(e[1], rq.InsertLines),
            -e[0],
        ),
    )
    for _, op in by_position:
        if isinstance(op, rq.InsertLines):
            out[op.after_line : op.after_line] = block(op.new_content)
        else:
            new = block(op.new_content) if isinstance(op, rq.ReplaceLines) else []
            out[op.start_line - 1 : op.end_line] = new
    return out


@given(st.lists(st.sampled_from(["a\n", "b\n", "c\n"]), max_size=6), st.lists(_line_op, max_size=3))
def test_line_operations_match_list_operations(lines: list[str], ops: list) -> None:  # type: ignore[type-arg]
    expected = _reference(lines, ops)
    if expected is None:
        with pytest.raises(QuillError) as info:
            modify_lines(lines, ops)
        assert info.value.code == ErrorCode.INVALID_ARGUMENT
        return
    assert modify_lines(lines, ops) == expected


def test_regex_replace_uses_dollar_groups_and_flags() -> None:
    op = rq.RegexReplace(
        pattern=r"oldAPI\.method\(([^)]+)\)", replacement="newAPI.improvedMethod($1)", flags="g"
    )
    text = "oldAPI.method(a); oldAPI.method(b)\n"
    assert regex_replace(text, op, remaining=_second) == (
        "newAPI.improvedMethod(a); newAPI.improvedMethod(b)\n",
        2,
    )
    first = rq.RegexReplace(pattern="o", replacement="0")
    assert regex_replace("foo", first, remaining=_second) == ("f0o", 1)
    named = rq.RegexReplace(pattern=r"(?P<w>\w+)@", replacement="$<w> at $$ $&", flags="i")
    assert regex_replace("Me@x", named, remaining=_second) == ("Me at $ Me@x", 1)
    assert (
        regex_replace("a", rq.RegexReplace(pattern="a", replacement=r"\1\n"), remaining=_second)[0]
        == r"\1\n"
    )


@pytest.mark.parametrize(
    ("op", "code"),
    [
        (rq.RegexReplace(pattern="(unclosed", replacement="x"), ErrorCode.INVALID_ARGUMENT),
        (rq.RegexReplace(pattern="zzz", replacement="x"), ErrorCode.NO_MATCH),
        (rq.RegexReplace(pattern="(a)", replacement="$7"), ErrorCode.INVALID_ARGUMENT),
    ],
)
def test_regex_replace_refusals(op: rq.RegexReplace, code: ErrorCode) -> None:
    with pytest.raises(QuillError) as info:
        regex_replace("abc", op, remaining=_second)
    assert info.value.code == code


def test_modify_all_or_nothing() -> None:
    h = Harness()
    _file(h, "one\ntwo\nthree\n")
    bad = [
        rq.DeleteLines(start_line=1, end_line=1),
        rq.RegexReplace(pattern="nope", replacement=""),
    ]
    h.fails(rq.ModifyFile(path="f.txt", operations=bad), ErrorCode.NO_MATCH)
    h.fails(
        rq.ModifyFile(path="f.txt", operations=[rq.DeleteLines(start_line=2, end_line=9)]),
        ErrorCode.INVALID_ARGUMENT,
    )
    ops = [
        rq.ReplaceLines(start_line=1, end_line=1, new_content="ONE"),
        rq.InsertLines(after_line=3, new_content="four"),
        rq.RegexReplace(pattern="t(w|h)", replacement="T$1", flags="g"),
    ]
    d = h.run(rq.ModifyFile(path="f.txt", operations=ops))
    assert h.text("f.txt") == "ONE\nTwo\nThree\nfour\n"
    assert (d.result.lines_before, d.result.lines_after, d.result.replacements) == (3, 4, 2)  # type: ignore[attr-defined]


def test_modify_keeps_a_missing_final_newline() -> None:
    h = Harness()
    _file(h, "a\nb")
    h.run(
        rq.ModifyFile(
            path="f.txt", operations=[rq.ReplaceLines(start_line=1, end_line=1, new_content="A")]
        )
    )
    assert h.text("f.txt") == "A\nb" and split_lines("A\nb") == ["A\n", "b"]
