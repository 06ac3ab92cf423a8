"""How a command is sent when it may be refused for now: the ``Waiting`` a ``Quill`` is given.

A command may be refused until another session's lock goes (``LOCKED``) or a human approves
it (``APPROVAL_REQUIRED``); with a wait (``wait_ms``, sent as ``Ws-Wait``) the writer holds it
that long instead. The SDK sends each command once, with its wait: ``Waiting``, the default.
A program that shows what it waits for (the CLI, ``quill_cli/client.py``: whose lock, which
approval to decide, and a note of a request left for ``quill resume``) gives its ``Quill``
another ``Waiting``. Every command and exec request then goes through its ``send``, handed
what is asked (``Asked``) and how to send it: ``send(ms)`` sends the request with a wait of
``ms``, always with the same request id, so sending it again is the same request (one
approval, one change), not another. The policy supplies behaviour; the SDK keeps the
requests' signatures, headers and retries in one place (``quill/client.py``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Asked:
    """A command about to be sent, as its ``Waiting`` sees it."""

    kind: str
    """``cmd`` (a change, through the writer) or ``exec`` (a command run by an executor)."""
    tenant: str
    workspace: str
    op: str
    request_id: str
    wait_ms: int
    """How long the caller lets it wait for a lock or an approval."""


class Waiting:
    """Send each command once, with the wait its caller gives (``Ws-Wait``)."""

    async def send(self, asked: Asked, send: Callable[[int], Awaitable[T]]) -> T:
        """Send the command ``asked`` (``send(ms)``: with a wait of ``ms``) and return its
        reply. A policy may send it more than once (the same request each time).

        Raises:
            QuillError: the reply's error, as ``Quill.request``.
        """
        return await send(asked.wait_ms)
