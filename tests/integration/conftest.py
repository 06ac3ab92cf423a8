"""Integration tests share the root fixtures (tests/conftest.py); ``StartReader`` is kept
importable from here."""

from tests.conftest import StartReader

__all__ = ["StartReader"]
