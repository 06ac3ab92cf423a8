"""JSON encoding and decoding of requests, replies and events; decoders are built once."""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from contracts.errors import ErrorCode, QuillError
from contracts.events import WorkspaceEvent
from contracts.ops import OpSpec
from contracts.replies import ErrorBody, Reply
from contracts.requests import Request

T = TypeVar("T")

_encoder = msgspec.json.Encoder()
_event_decoder: msgspec.json.Decoder[WorkspaceEvent] = msgspec.json.Decoder(WorkspaceEvent)
_any_decoder = msgspec.json.Decoder()


def encode(obj: Any) -> bytes:
    return _encoder.encode(obj)


_decoders: dict[Any, msgspec.json.Decoder[Any]] = {}


def _decoder(tp: Any) -> msgspec.json.Decoder[Any]:
    decoder = _decoders.get(tp)
    if decoder is None:
        decoder = _decoders[tp] = msgspec.json.Decoder(tp)
    return decoder


def decode(data: bytes, tp: type[T]) -> T:
    """Decode ``data`` as ``tp``.

    Raises:
        QuillError: ``INVALID_ARGUMENT`` naming the problem (bad JSON, a string that is not
            UTF-8, unknown field, type).
    """
    try:
        result: T = _decoder(tp).decode(data)
    except msgspec.ValidationError as exc:
        raise QuillError(ErrorCode.INVALID_ARGUMENT, f"Invalid request: {exc}") from None
    except msgspec.DecodeError as exc:
        raise QuillError(ErrorCode.INVALID_ARGUMENT, f"Invalid JSON: {exc}") from None
    except UnicodeDecodeError as exc:  # msgspec's, for a string that is not UTF-8
        raise QuillError(
            ErrorCode.INVALID_ARGUMENT,
            f"Invalid JSON: a string is not valid UTF-8 ({exc.reason})",
            {"encoding": "utf-8"},
        ) from None
    except RecursionError:
        raise QuillError(ErrorCode.INVALID_ARGUMENT, "Invalid JSON: nested too deep") from None
    return result


def decode_request(spec: OpSpec, data: bytes) -> Request:
    """Decode a request body for ``spec`` (an empty body is ``{}``)."""
    if not data or data.isspace():
        data = b"{}"
    return decode(data, spec.request)


def ok_reply(version: int | None, result: Any) -> bytes:
    return _encoder.encode(Reply(ok=True, version=version, result=result))


def ok_reply_raw(version: int | None, result: bytes) -> bytes:
    """An ok reply around an already-encoded result (a stored result, replayed)."""
    return b'{"ok":true,"version":%d,"result":%s}' % (version or 0, result)


def error_reply(error: QuillError) -> bytes:
    """The error reply; always one: a message or details that JSON cannot carry (a lone
    surrogate, an object of no JSON type) are escaped, or dropped, rather than unanswered."""
    body = ErrorBody(code=str(error.code), message=error.message, details=error.details)
    try:
        return _encoder.encode(Reply[Any](ok=False, error=body))
    except (UnicodeEncodeError, TypeError, msgspec.EncodeError):
        message = error.message.encode("utf-8", "backslashreplace").decode("utf-8")
        safe = ErrorBody(code=str(error.code), message=message, details={})
        return _encoder.encode(Reply[Any](ok=False, error=safe))


_reply_decoders: dict[Any, msgspec.json.Decoder[Any]] = {}


def _reply_decoder(result_type: Any) -> msgspec.json.Decoder[Any]:
    """The decoder of ``Reply[result_type]``, keyed by ``result_type`` itself: building and
    hashing the generic alias on every reply cost a client more than the decoding."""
    decoder = _reply_decoders.get(result_type)
    if decoder is None:
        decoder = _reply_decoders[result_type] = msgspec.json.Decoder(Reply[result_type])
    return decoder


def decode_reply(data: bytes, result_type: type[T]) -> tuple[int | None, T]:
    """Decode a reply and return ``(version, result)``.

    Raises:
        QuillError: the error the reply carries, or ``INTERNAL`` for an undecodable reply.
    """
    try:
        reply: Reply[T] = _reply_decoder(result_type).decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise QuillError(ErrorCode.INTERNAL, f"Undecodable reply: {exc}") from None
    if not reply.ok:
        err = reply.error or ErrorBody(code="INTERNAL", message="error reply without a body")
        raise QuillError(err.code, err.message, err.details)
    assert reply.result is not None
    return reply.version, reply.result


def decode_event(data: bytes) -> WorkspaceEvent:
    return _event_decoder.decode(data)


def decode_json(data: bytes) -> Any:
    return _any_decoder.decode(data)
