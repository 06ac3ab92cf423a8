"""core.chain: the per-event checks quill verify and the console share."""

from __future__ import annotations

import hashlib

from contracts.hashing import ZERO_HASH
from core import chain


def test_a_link_holds_only_for_the_next_version_chained_to_the_previous_hash() -> None:
    assert chain.link(*chain.GENESIS, 1, ZERO_HASH) is None
    assert chain.link(4, "a" * 64, 5, "a" * 64) is None
    gap = chain.link(4, "a" * 64, 6, "a" * 64)
    assert gap == chain.Broken(6, "Version 6 follows version 4")
    wrong = chain.link(4, "a" * 64, 5, "b" * 64)
    assert wrong is not None and wrong.version == 5 and "Hash chain broken" in wrong.message
    assert wrong.details == {"prev_hash": "b" * 64, "previous": "a" * 64}
    assert chain.link(*chain.GENESIS, 1, "a" * 64) is not None


def test_payloads_and_contents_hash_to_what_they_name() -> None:
    data = b'{"type":"x"}'
    digest = hashlib.sha256(data).hexdigest()
    assert chain.payload(data, digest, 3) == (digest, None)
    assert chain.payload(data, None, 3) == (digest, None)
    _, broken = chain.payload(data + b" ", digest, 3)
    assert broken is not None and broken.version == 3
    assert chain.content("a.txt", b"hi", hashlib.sha256(b"hi").hexdigest(), 2) is None
    bad = chain.content("a.txt", b"hi", digest, 2)
    assert bad == chain.Broken(2, "The content of a.txt does not match its sha256")
