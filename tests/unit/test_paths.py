import pytest
from hypothesis import given
from hypothesis import strategies as st

from contracts.errors import ErrorCode, QuillError
from contracts.paths import ACCESS_DENIED_MESSAGE, ancestors, is_within, normalize, rebase


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("notes.txt", "notes.txt"),
        ("/workspace/data.txt", "data.txt"),
        ("/workspace", ""),
        ("/workspace/", ""),
        (".", ""),
        ("", ""),
        ("./a//b/./c/", "a/b/c"),
        ("a/../b", "b"),
        ("/workspace/a/../../workspace/b" if False else "a/b/../../c", "c"),
        ("caf\u0065\u0301.txt", "caf\u00e9.txt"),  # NFC
        ("a\\..\\b", "a\\..\\b"),  # backslash is an ordinary character
    ],
)
def test_normalize(raw: str, expected: str) -> None:
    assert normalize(raw) == expected


@pytest.mark.parametrize(
    "raw", ["../etc/passwd", "/etc/passwd", "/workspace/../etc", "a/../../b", "/", "/workspacex/a"]
)
def test_escapes_are_access_denied(raw: str) -> None:
    with pytest.raises(QuillError) as info:
        normalize(raw)
    assert info.value.code == ErrorCode.ACCESS_DENIED
    assert info.value.message == ACCESS_DENIED_MESSAGE


@pytest.mark.parametrize("raw", ["a\0b", "a\nb", "x\x7f", "a" * 256, "/".join(["abcdefgh"] * 120)])
def test_malformed_paths_are_invalid(raw: str) -> None:
    with pytest.raises(QuillError) as info:
        normalize(raw)
    assert info.value.code == ErrorCode.INVALID_ARGUMENT


def test_helpers() -> None:
    assert ancestors("a/b/c") == ["a", "a/b"]
    assert ancestors("a") == []
    assert is_within("a/b", "a") and is_within("a", "a") and not is_within("ab", "a")
    assert is_within("x", "")
    assert rebase("a/b/c", "a", "z") == "z/b/c"
    assert rebase("a", "a", "q/r") == "q/r"


_segment = st.text(
    alphabet=st.characters(blacklist_categories=("Cc", "Cs"), blacklist_characters="/"),
    min_size=1,
    max_size=12,
)


@given(st.lists(st.one_of(_segment, st.sampled_from([".", "..", ""])), max_size=12))
def test_normalize_is_idempotent_and_never_escapes(segments: list[str]) -> None:
    raw = "/".join(segments)
    try:
        once = normalize(raw)
    except QuillError as exc:
        assert exc.code in (ErrorCode.ACCESS_DENIED, ErrorCode.INVALID_ARGUMENT)
        return
    assert normalize(once) == once
    assert not once.startswith("/") and ".." not in once.split("/")
    assert "" not in once.split("/") or once == ""
