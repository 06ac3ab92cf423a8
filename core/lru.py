"""Caches bounded in memory, least recently used first: ``SizedLRU`` by the total size of its
values (contents, immutable by sha256, so never invalidated), ``LRU`` by its count of
entries."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sized
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V", bound=Sized)
T = TypeVar("T")


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


class LRU(Generic[K, T]):
    """At most ``most`` entries; past it, the least recently used (got or put) goes."""

    def __init__(self, most: int) -> None:
        self._items: OrderedDict[K, T] = OrderedDict()
        self.most = most

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: K) -> bool:
        return key in self._items

    def get(self, key: K) -> T | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: K, value: T) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.most:
            self._items.popitem(last=False)

    def pop(self, key: K) -> T | None:
        return self._items.pop(key, None)
