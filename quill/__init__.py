"""Quill: the SDK (``quill.client``), the CLI and the embedded launcher."""

from contracts.errors import ErrorCode, QuillError
from quill.client import Quill, Workspace

__all__ = ["ErrorCode", "Quill", "QuillError", "Workspace"]
