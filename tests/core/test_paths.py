import pytest
from hypothesis import given
from hypothesis import strategies as st

from contracts.errors import ErrorCode, QuillError
from contracts.paths import (
    ACCESS_DENIED_MESSAGE,
    ancestors,
    in_log,
    is_within,
    normalize,
    normalize_file,
    printable,
    problem,
    rebase,
)


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
        ("caf\u00e9/r\u00e9sum\u00e9.md", "caf\u00e9/r\u00e9sum\u00e9.md"),  # NFC: fine
        ("\U0001f600 \u2764\ufe0f \ue000.txt", "\U0001f600 \u2764\ufe0f \ue000.txt"),
        ("a:b/C:x/ab:", "a:b/C:x/ab:"),  # a colon is an ordinary character: only ``C:`` is a drive
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


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        (
            "C:\\foo",
            "'C:' is a Windows drive, not a name: paths are POSIX paths relative to "
            "/workspace, with / between names (e.g. 'foo')",
        ),
        ("c:\\Users\\me\\notes.txt", "(e.g. 'Users/me/notes.txt')"),
        ("D:/data/x.csv", "'D:' is a Windows drive, not a name"),
        ("C:", "'C:' is a Windows drive, not a name"),
        ("\\\\server\\share\\f", "a backslash is not a path separator here"),
        (
            "src\\main.py",
            "a backslash is not a path separator here and no name may hold one: "
            "write 'src/main.py' (paths are POSIX paths relative to /workspace)",
        ),
        ("a\\..\\b", "write 'a/../b'"),
        ("x/C:", "'C:' cannot be a name: it reads as a Windows drive"),
    ],
)
def test_windows_paths_are_refused_with_the_posix_spelling(raw: str, says: str) -> None:
    for rule in (normalize, normalize_file):
        with pytest.raises(QuillError) as info:
            rule(raw)
        assert info.value.code == ErrorCode.INVALID_ARGUMENT
        assert info.value.message.startswith(f"Invalid path '{raw}': ")
        assert says in info.value.message
    assert problem(raw) is not None  # found on disk (a command made it): not committed either


def test_a_backslash_name_already_in_a_log_stays_reachable() -> None:
    from contracts.paths import normalize_existing

    assert in_log("old\\name.txt")
    assert normalize_existing("old\\name.txt") == "old\\name.txt"


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


REFUSED = [
    # (name, the reason's start, how it is shown)
    ("a\x00b", "U+0000 is a control character", "a\\x00b"),
    ("new\nline.txt", "U+000A is a control character", "new\\nline.txt"),
    ("x\x1b[31m", "U+001B is a control character", "x\\x1b[31m"),
    ("del\x7f", "U+007F is a control character", "del\\x7f"),
    ("c1\x9b", "U+009B is a control character", "c1\\x9b"),
    ("evil\u202etxt.md", "U+202E RIGHT-TO-LEFT OVERRIDE is an invisible", "evil\\u202etxt.md"),
    ("iso\u2066late", "U+2066 LEFT-TO-RIGHT ISOLATE", "iso\\u2066late"),
    ("rlm\u200f", "U+200F RIGHT-TO-LEFT MARK", "rlm\\u200f"),
    ("zero\u200bwidth", "U+200B ZERO WIDTH SPACE", "zero\\u200bwidth"),
    ("zwj\u200d", "U+200D ZERO WIDTH JOINER", "zwj\\u200d"),
    ("\ufeffbom", "U+FEFF ZERO WIDTH NO-BREAK SPACE", "\\ufeffbom"),
    ("soft\u00adhyphen", "U+00AD SOFT HYPHEN", "soft\\xadhyphen"),
    ("tag\U000e0041", "U+E0041 TAG LATIN CAPITAL LETTER A", "tag\\U000e0041"),
    ("line\u2028sep", "U+2028 LINE SEPARATOR is a line separator", "line\\u2028sep"),
    ("hangul\u3164filler", "U+3164 HANGUL FILLER is an invisible", "hangul\\u3164filler"),
    ("non\ufffe", "U+FFFE is a noncharacter", "non\\ufffe"),
    ("lone\ud800", "U+D800 is a lone surrogate", "lone\\ud800"),
    ("bad\udcff.txt", "not valid UTF-8 (byte 0xFF)", "bad\\xff.txt"),  # from os.scandir
    ("cafe\u0301.txt", "not in Unicode NFC (U+0301 COMBINING ACUTE ACCENT", "cafe\u0301.txt"),
]


@pytest.mark.parametrize(("raw", "reason", "shown"), REFUSED)
def test_one_rule_refuses_what_can_look_like_another_name(
    raw: str, reason: str, shown: str
) -> None:
    """Refused wherever it stands (a directory's name too), never normalised; the message
    names the character by code point and shows the path escaped (encodable, displayable)."""
    for path in (raw, f"dir/{raw}/x.txt", f"/workspace/{raw}"):
        with pytest.raises(QuillError) as info:
            normalize(path)
        error = info.value
        assert error.code == ErrorCode.INVALID_ARGUMENT
        assert f": {reason}" in error.message, error.message
        assert shown in error.details["path"]
        error.message.encode()  # no surrogate left: a reply can carry it
        assert problem(raw.lstrip("/")) is not None
    assert printable(raw) == shown


def test_nfc_is_required_not_made() -> None:
    """A decomposed name is refused (its NFC spelling given), so that it can never overwrite
    the composed one nor be a second file looking the same."""
    with pytest.raises(QuillError) as info:
        normalize("cafe\u0301.txt")
    assert info.value.message.endswith("write it as 'caf\u00e9.txt'")
    assert normalize("caf\u00e9.txt") == "caf\u00e9.txt"


@pytest.mark.parametrize("raw", ["dir/", "a/dir/", "dir/.", "a/b/..", "/workspace/dir/"])
def test_a_file_path_cannot_name_a_directory(raw: str) -> None:
    with pytest.raises(QuillError) as info:
        normalize_file(raw)
    assert info.value.code == ErrorCode.INVALID_ARGUMENT
    assert "names a directory" in info.value.message
    assert normalize_file("./a//b.txt") == "a/b.txt" and normalize(raw) == normalize(raw)


def test_valid_names_print_unchanged_and_problems_on_disk() -> None:
    assert printable("caf\u00e9/a b\\c.txt") == "caf\u00e9/a b\\c.txt"
    assert problem("a/" + "x" * 256) == "a name is longer than 255 bytes"
    assert problem("/".join(["d" * 200] * 6)) == "path longer than 1024 bytes"
    assert problem("ok/fine.txt") is None


def test_a_log_path_from_before_the_rule_is_still_safe_to_materialise() -> None:
    assert in_log("old/evil\u202etxt.md") and in_log("caf\u00e9.txt")
    for unsafe in ("", "/etc/passwd", "a/../b", "a//b", "./a", "a/", "a\nb", "x\udcff", ".."):
        assert not in_log(unsafe), unsafe
