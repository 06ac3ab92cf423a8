"""Request fields on log records (``infra.logfields``): the text and JSON forms, the level of
a failure's line, and that a call's own fields win over the bound request's."""

from __future__ import annotations

import json
import logging
import sys

import pytest

from contracts.errors import ErrorCode, QuillError
from contracts.subjects import Address, Origin
from infra import logfields
from infra.runtime import JsonFormatter

ADDRESS = Address("cmd", "acme", "notes", "write")


def record(msg: str = "hello", **extra: str) -> logging.LogRecord:
    made = logging.LogRecord("quill.t", logging.INFO, __file__, 1, msg, None, None)
    made.__dict__.update(extra)
    logfields.RequestFields().filter(made)
    return made


def test_a_bound_request_names_every_line_as_fields() -> None:
    token = logfields.bind(ADDRESS, Origin("r-1"))
    try:
        line = record()
        text = logfields.TextFormatter().format(line)
        as_json = json.loads(JsonFormatter().format(line))
    finally:
        logfields.reset(token)
    assert text.endswith("hello request_id=r-1 tenant=acme workspace=notes op=cmd.write")
    assert {k: as_json[k] for k in ("request_id", "tenant", "workspace", "op")} == {
        "request_id": "r-1",
        "tenant": "acme",
        "workspace": "notes",
        "op": "cmd.write",
    }
    assert "code" not in as_json
    assert logfields.current() == {}  # reset: the next line names nothing
    assert "request_id" not in JsonFormatter().format(record())


def test_a_call_s_own_fields_win_and_a_traceback_stays_below_them() -> None:
    token = logfields.bind(ADDRESS, Origin("r-1"))
    try:
        line = record(request_id="r-2", code="CONFLICT")
    finally:
        logfields.reset(token)
    try:
        raise ValueError("boom")
    except ValueError:
        line.exc_info = sys.exc_info()
    first, *rest = logfields.TextFormatter().format(line).splitlines()
    assert first.endswith("request_id=r-2 tenant=acme workspace=notes op=cmd.write code=CONFLICT")
    assert rest[0].startswith("Traceback") and "ValueError: boom" in rest[-1]


def test_the_level_of_a_failure_says_whose_it_is() -> None:
    assert logfields.failure_level(ErrorCode.INTERNAL) == logging.ERROR
    for code in (ErrorCode.UNAVAILABLE, ErrorCode.TIMEOUT, "STORAGE_FULL"):
        assert logfields.failure_level(code) == logging.WARNING, code
    for code in (ErrorCode.CONFLICT, ErrorCode.INVALID_ARGUMENT, ErrorCode.FILE_NOT_FOUND):
        assert logfields.failure_level(code) == logging.INFO, code


def test_one_line_per_failure_with_its_fields(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, "quill.requests"):
        logfields.failed(ADDRESS, Origin("r-3"), QuillError(ErrorCode.UNAVAILABLE, "later"))
    (line,) = caplog.records
    assert line.levelno == logging.WARNING
    fields = logfields.fields_of(line)
    assert fields == {
        "request_id": "r-3",
        "tenant": "acme",
        "workspace": "notes",
        "op": "cmd.write",
        "code": "UNAVAILABLE",
    }


def test_a_failure_naming_a_newline_stays_one_line(caplog: pytest.LogCaptureFixture) -> None:
    forged = "x\n2026-01-01 00:00:00,000 ERROR quill.writer: forged"
    with caplog.at_level(logging.INFO, "quill.requests"):
        logfields.failed(ADDRESS, Origin("r-4"), QuillError(ErrorCode.FILE_NOT_FOUND, forged))
    (line,) = caplog.records
    text = logfields.TextFormatter().format(line)
    assert "\n" not in text and "x\\x0a2026" in text


def test_a_busy_answer_is_not_a_line_each(caplog: pytest.LogCaptureFixture) -> None:
    """A flood of busy answers must not become a flood of warnings (infra.busy summarises)."""
    busy = QuillError(ErrorCode.UNAVAILABLE, "busy", {"reason": "busy", "queue": "commands"})
    with caplog.at_level(logging.INFO, "quill.requests"):
        for _ in range(100):
            logfields.failed(ADDRESS, Origin("r-4"), busy)
    assert caplog.records == []
