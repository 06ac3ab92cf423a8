"""A client's regular expression on RE2 means what it means on ``regex`` (the engine of record),
and the patterns a backtracking engine takes exponential time over run on RE2."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from contracts.errors import ErrorCode, QuillError
from core.regexes import UserPattern, _Backtracking, _Linear

_TOKENS = st.sampled_from(
    ["a", "b", ".", r"\d", r"\w", r"\s", r"\W", r"\S", "[ab]", "[^a]", r"[a-c\d]", r"[^\w]"]
    + ["(", ")", "(?:", "|", "*", "+", "?", "*?", "+?", "{2}", "{1,3}", "{,2}", "^", "$"]
    + [r"\b", r"\B", r"\A", r"\Z", "(?i)", "(?i:", "(?P<n>", " ", r"\n", "é", "É", "1", "_"]
)
_TEXT = st.text(alphabet="abcAB1_ é\nÉ.-", max_size=12)


def _chars(text: str, spans: list[tuple[int, int]] | None) -> list[tuple[int, int]] | None:
    """RE2's byte offsets as character offsets."""
    if spans is None:
        return None
    data = text.encode()
    return [
        (-1, -1) if s < 0 else (len(data[:s].decode()), len(data[:e].decode())) for s, e in spans
    ]


@settings(max_examples=600, deadline=None)
@given(
    st.lists(_TOKENS, min_size=1, max_size=7).map("".join),
    st.sampled_from(["", "m", "i", "s", "ms", "im"]),
    st.lists(_TEXT, min_size=1, max_size=5),
    st.integers(0, 12),
)
def test_re2_finds_what_regex_finds(pattern: str, flags: str, texts: list[str], at: int) -> None:
    """Where a pattern runs on RE2, every search (from any position) finds the same match
    and the same groups as ``regex``."""
    try:
        compiled = UserPattern(pattern, flags)
    except QuillError:
        return
    assume(compiled.linear is not None)
    for text in texts:
        if compiled.ascii_only and not text.isascii():
            continue
        pos = min(at, len(text))
        try:
            expected = _Backtracking(compiled.fallback, text).search(pos, 5.0)
        except TimeoutError:
            continue
        found = _Linear(compiled.linear, text.encode()).search(len(text[:pos].encode()), 5.0)
        assert _chars(text, found) == expected, (pattern, flags, text, pos)


@pytest.mark.parametrize(
    "pattern", [r"(a|aa)+$", r"(a*)*b", r"^(\w+\s?)*$", r"(x+x+)+y", r"function\s+\w+"]
)
def test_patterns_that_backtrack_exponentially_run_on_re2(pattern: str) -> None:
    compiled = UserPattern(pattern, "m")
    assert compiled.linear is not None
    subject = compiled.over(("a" * 40 + "!\n") * 1000)
    assert isinstance(subject, _Linear)
    subject.search(0, 0.0)  # no budget needed: linear


@pytest.mark.parametrize(
    ("pattern", "text"),
    [
        (r"(a)\1", "aa"),  # a backreference
        (r"a(?=b)", "ab"),  # lookaround
        (r"(?>a+)b", "aab"),  # an atomic group
        (r"a++b", "aab"),  # a possessive repeat
        (r"[[:alpha:]]", "a"),  # a set regex reads otherwise than re
        (r"a$", "a\n"),  # $ before a last newline, without MULTILINE
    ],
)
def test_what_re2_cannot_say_runs_on_regex(pattern: str, text: str) -> None:
    compiled = UserPattern(pattern)
    assert isinstance(compiled.over(text), _Backtracking)


def test_word_boundaries_run_on_re2_over_ascii_only() -> None:
    compiled = UserPattern(r"\bé", "m")
    assert isinstance(compiled.over("x é"), _Backtracking)  # RE2's \b is ASCII
    assert isinstance(UserPattern(r"\bx").over("a x"), _Linear)


def test_an_invalid_pattern_is_named() -> None:
    with pytest.raises(QuillError) as info:
        UserPattern("unclosed(")
    assert info.value.code == ErrorCode.INVALID_ARGUMENT
    assert info.value.message.startswith("Invalid regex 'unclosed(': ")
