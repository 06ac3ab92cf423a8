import pytest

from contracts.errors import ErrorCode, QuillError
from contracts.subjects import Address, Origin, Subjects, split_workspace


def test_subjects_round_trip() -> None:
    s = Subjects("ws")
    assert s.cmd("acme", "demo", "write") == "ws.cmd.acme.demo.write"
    assert s.parse_request("ws.cmd.acme.demo.write") == Address("cmd", "acme", "demo", "write")
    assert s.parse_request(s.replica("reader-1", "acme", "demo", "read")) == Address(
        "qry", "acme", "demo", "read"
    )
    assert s.msg_id("acme", "demo", "r1") == "acme/demo/r1"


@pytest.mark.parametrize(
    "subject", ["ws.cmd.Acme.demo.write", "ws.cmd.acme.demo", "other.cmd.a.b.c", "ws.cmd.a.b.Op"]
)
def test_bad_subjects(subject: str) -> None:
    with pytest.raises(QuillError) as info:
        Subjects().parse_request(subject)
    assert info.value.code == ErrorCode.INVALID_ARGUMENT


def test_workspace_names_and_headers() -> None:
    assert split_workspace("acme/demo") == ("acme", "demo")
    for bad in ("acme", "a/b/c", "Acme/demo", "-x/demo", "a/" + "x" * 65):
        with pytest.raises(QuillError):
            split_workspace(bad)
    origin = Origin.from_headers({"Ws-Actor": "agent", "Ws-Request-Id": "abc-1"})
    assert (origin.actor, origin.request_id, origin.session) == ("agent", "abc-1", None)
    assert Origin.from_headers(None, new_id=lambda: "fresh").request_id == "fresh"
    assert Origin.from_headers(None).request_id == ""
    with pytest.raises(QuillError):
        Origin.from_headers({"Ws-Request-Id": "has space"})
    with pytest.raises(QuillError):
        Origin.from_headers({"Ws-Actor": "x" * 300})


def test_a_generated_request_id_is_a_valid_one() -> None:
    """A request without ``Ws-Request-Id`` gets an id as valid as a client's (the executor
    once made ``bytearray(b'…')`` of a NUID, refused by its own ``apply``)."""
    from uuid import uuid4

    from nats.nuid import NUID

    from contracts.subjects import CHANGES_SUFFIX, check_request_id, new_request_id

    nuid = NUID()
    for new_id in (new_request_id, nuid.next, uuid4):
        request_id = Origin.from_headers({}, new_id=new_id).request_id
        assert "bytearray" not in request_id and "-" not in request_id
        assert check_request_id(request_id + CHANGES_SUFFIX)
    assert new_request_id() != new_request_id()
    with pytest.raises(ValueError):
        Origin.from_headers(None, new_id=lambda: "not an id")
