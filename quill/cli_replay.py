"""``quill replay``, ``quill verify``, ``quill export``/``import``, ``quill runs``: tooling
that works from the log alone."""

from __future__ import annotations
