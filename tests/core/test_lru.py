from __future__ import annotations

from core.lru import SizedLRU


def test_the_least_recently_used_goes_first_when_over_budget() -> None:
    cache: SizedLRU[bytes] = SizedLRU(10, largest_share=2)
    cache.put("a", b"aaaa")
    cache.put("b", b"bbbb")
    assert cache.get("a") == b"aaaa"  # a is now the most recent
    cache.put("c", b"cccc")  # 12 bytes > 10: b goes
    assert "b" not in cache and cache.get("a") == b"aaaa" and cache.get("c") == b"cccc"


def test_a_value_larger_than_its_share_is_not_kept() -> None:
    cache: SizedLRU[str] = SizedLRU(10, largest_share=2)
    cache.put("small", "x")
    cache.put("big", "y" * 6)
    assert cache.get("big") is None and cache.get("small") == "x"
