"""A cache of values by key, bounded by the total size of its values (least recently used
goes first). Contents are immutable by sha256, so these caches never need invalidating."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sized
from typing import Generic, TypeVar

V = TypeVar("V", bound=Sized)


class SizedLRU(Generic[V]):
    """At most ``max_bytes`` of values (``len`` of each); a value larger than
    ``max_bytes // largest_share`` is not kept, so one huge value cannot flush the rest."""

    def __init__(self, max_bytes: int, largest_share: int = 4) -> None:
        self._items: OrderedDict[str, V] = OrderedDict()
        self._bytes, self._max, self._share = 0, max_bytes, largest_share

    def get(self, key: str) -> V | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def __contains__(self, key: str) -> bool:
        return key in self._items

    def put(self, key: str, value: V) -> None:
        if key in self._items or len(value) > self._max // self._share:
            return
        self._items[key] = value
        self._bytes += len(value)
        while self._bytes > self._max:
            _, old = self._items.popitem(last=False)
            self._bytes -= len(old)
