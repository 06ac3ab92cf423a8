"""Text or binary: one definition for the whole service.

Content is binary when it is not valid UTF-8 or contains a NUL byte (as git and ripgrep
judge); binary files are never shown as text, searched or diffed line by line.
"""

from __future__ import annotations


def is_binary(data: bytes) -> bool:
    return as_text(data) is None


def as_text(data: bytes) -> str | None:
    """``data`` decoded as UTF-8, or None if it is binary."""
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def split_lines(text: str) -> list[str]:
    """Lines of ``text``, each with its own ``\n`` (only ``\n`` ends a line; a last line
    without one is still a line)."""
    if not text:
        return []
    lines = text.split("\n")
    out = [line + "\n" for line in lines[:-1]]
    if lines[-1]:
        out.append(lines[-1])
    return out
