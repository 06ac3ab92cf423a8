"""Quill's wire contract: subjects, requests, replies, events, errors and limits.

msgspec types only, no I/O. Clients in any language can use ``docs/contract.md``,
``docs/schemas/`` and ``docs/asyncapi.yaml``, which are generated from this package.
"""

from contracts.errors import RETRIABLE, ErrorCode, QuillError
from contracts.limits import DEFAULT_EXCLUSIONS, DEFAULT_LIMITS, Limits, LimitsPatch
from contracts.ops import OPS, OpSpec
from contracts.subjects import Subjects

__all__ = [
    "DEFAULT_EXCLUSIONS",
    "DEFAULT_LIMITS",
    "OPS",
    "RETRIABLE",
    "ErrorCode",
    "Limits",
    "LimitsPatch",
    "OpSpec",
    "QuillError",
    "Subjects",
]
