"""Quill's Python SDK: ``Quill`` connects, ``Workspace`` holds the tools (``quill.client``).

It imports ``contracts`` (the wire) and nothing of the server; the CLI is ``quill_cli``."""

from contracts.errors import ErrorCode, QuillError
from quill.client import Quill, Workspace

__all__ = ["ErrorCode", "Quill", "QuillError", "Workspace"]
