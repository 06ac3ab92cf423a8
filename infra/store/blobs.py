"""Contents (blobs) and the trigram index: what a reader's indexer keeps, indexes and
stashes (``infra.store``)."""

from __future__ import annotations

import zstandard

from core.content import as_text
from infra import sql
from infra.store.base import StoreBase

STASH_LEVEL = 3
"""zstd level of a stashed text (``index_remote``)."""


def unstash(stash: bytes) -> bytes:
    """The text ``index_remote`` compressed."""
    return zstandard.ZstdDecompressor().decompressobj().decompress(stash)


class Indexing(StoreBase):
    """Contents kept and fetched, and the trigram index a reader's search reads."""

    async def put_blob(self, sha256: str, data: bytes) -> None:
        """Keep content fetched from WS_BLOBS (a reader's indexer then indexes it)."""
        async with self._lock:
            await self._w.execute(sql.PUT_BLOB, (sha256, len(data), data))
            await self._w.commit()

    async def index_pending(self, max_bytes: int) -> int:
        """Add contents not yet in the trigram index to it (about ``max_bytes`` of them, in one
        transaction); return how many blobs were taken. Readers only."""
        async with self._lock:
            rows = list(await self._w.execute_fetchall(sql.UNINDEXED))
            taken, texts, used = [], [], 0
            for rowid, data in rows:
                taken.append((rowid,))
                text = as_text(bytes(data))
                if text is not None:
                    texts.append((rowid, text))
                used += len(data)
                if used >= max_bytes:
                    break
            if not taken:
                return 0
            await self._w.executemany(sql.INDEX_CONTENT, texts)
            await self._w.executemany(sql.MARK_INDEXED, taken)
            await self._w.commit()
            return len(taken)

    async def remote_unindexed(self, limit: int) -> list[tuple[int, str, str, str]]:
        """Up to ``limit`` contents not indexed because they are only in WS_BLOBS: ``(rowid,
        sha256, tenant, workspace)``, the workspace whose namespace holds each. Readers only."""
        rows = await self._r.execute_fetchall(sql.REMOTE_UNINDEXED, (limit,))
        return [(int(r[0]), str(r[1]), str(r[2]), str(r[3])) for r in rows]

    async def index_remote(self, texts: list[tuple[int, str]]) -> None:
        """Index ``(rowid, text)``: contents of blobs fetched from WS_BLOBS, without keeping
        them: only compressed in ``stash``, for a purge to take them out of the index again (a
        contentless index forgets an entry only given its content). Readers only."""
        compress = zstandard.ZstdCompressor(level=STASH_LEVEL).compress
        stashed = [(rowid, text, compress(text.encode())) for rowid, text in texts]
        async with self._lock:
            for rowid, text, stash in stashed:
                if not list(await self._w.execute_fetchall(sql.IS_UNINDEXED, (rowid,))):
                    continue  # indexed meanwhile (a read fetched and kept it)
                await self._w.execute(sql.INDEX_CONTENT, (rowid, text))
                await self._w.execute(sql.INDEXED_REMOTE, (stash, rowid))
            await self._w.commit()

    async def content_unreachable(self, sha256: str) -> None:
        """Its workspace's namespace no longer has ``sha256``: stop fetching it (it stays a
        grep candidate, read when a grep asks). Readers only."""
        async with self._lock:
            await self._w.execute(sql.UNREACHABLE, (sha256,))
            await self._w.commit()

    async def indexed_without_content(self, sha256: str) -> None:
        """A binary content the indexer fetched: nothing to index, nothing to keep (the next
        read fetches it again). Readers only."""
        async with self._lock:
            await self._w.execute(sql.INDEXED_WITHOUT_CONTENT, (sha256,))
            await self._w.commit()

    async def blob(self, sha256: str) -> bytes | None:
        rows = list(await self._r.execute_fetchall(sql.BLOB, (sha256,)))
        return bytes(rows[0][0]) if rows and rows[0][0] is not None else None
