"""The executor's checkouts on its data disk: one per workspace, under
``<data>/checkouts/<tenant>/<workspace>/`` (``infra.exec.checkout``), held by one request at a
time, synced to the log before each, kept within each workspace's quota (``quota``), and within
a byte budget for all of them and the disk's free-space reserve (``disk``): idle ones are
evicted, least recently used first. A request pinned to an older version gets a checkout of its
own built at that version (``at``), removed after it; it counts against the budget meanwhile.

What one checkout may hold (``allowance``): its workspace's ``max_checkout_bytes``, at most
the executor's ceiling (``--max-checkout-mb``, default the budget), at most what the budget
leaves beside the other checkouts once the idle ones are evicted; a command never has to give
back what its checkout held when it started.

A checkout removed (evicted, purged, rebuilt, one built at an older version) goes to the trash
(``infra.exec.trash``): renamed at once, removed from there without recursion, a bounded amount
at a time, the rest in the background (``tidy``); one that cannot be removed is logged and left
there. No tree a command made, however deep, can fail a request or an executor's start for good.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError
from nats.nuid import NUID

from contracts import codec
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError, no_version, no_workspace
from contracts.events import WorkspacePurged
from contracts.replies import TreePage
from contracts.subjects import STREAM_EVENTS, Address, Subjects
from infra import compaction
from infra.blobs import Blobs
from infra.exec.checkout import Checkout
from infra.exec.layers import Merged
from infra.exec.sandbox import overlay
from infra.exec.trash import Trash
from infra.safefs import Owner
from quill.client import Quill
from services.executor import disk, quota

log = logging.getLogger("quill.executor")
T = TypeVar("T")

Key = tuple[str, str]
"""(tenant, workspace)."""

AT = ".at"
"""Under ``<data>/checkouts``: the checkouts built at an older version, one per request."""
TRASH = ".trash"
"""Under ``<data>/checkouts``: what is being removed, or could not be (``infra.exec.trash``)."""
TREE_PAGE = 2000
"""Entries per page of a reader's tree (a new checkout's first build, ``infra.exec.seed``)."""
TREE_WAIT_S = 30.0
"""The longest a page of a reader's tree is waited for (then the log is replayed)."""
IN_MEMORY = 256
"""Idle checkouts whose manifest (a row per path of the workspace) stays in memory; past it
the least recently used is forgotten, not removed: its manifest is read again from
``manifest.bin`` when next used, as after a restart."""


class Checkouts:
    """The checkouts of one executor (see the module docstring). ``background`` runs an
    eviction the executor waits for when it stops."""

    def __init__(
        self,
        data_dir: Path,
        js: JetStreamContext,
        subjects: Subjects,
        blobs: Blobs,
        quill: Quill,
        *,
        budget: int,
        reserve: int | None,
        background: Callable[[Coroutine[Any, Any, None]], None],
        gone: Callable[[Path], None] = lambda tree: None,
        owner: Owner | None = None,
        ceiling: int | None = None,
        links: Callable[[], bool] = lambda: False,
    ) -> None:
        """``ceiling``: the most one checkout may hold, whatever its workspace says (None:
        ``budget``); ``links``: whether commands run over overlays (never writing a
        checkout's files in place), so that a fork's first checkout may be hard links to its
        source's (``infra.exec.links``)."""
        self.links = links
        self.data_dir, self.js, self.subjects, self.blobs = data_dir, js, subjects, blobs
        self.owner = owner
        """Who each checkout's tree belongs to (``Provider.owner``)."""
        self.trash = Trash(data_dir / "checkouts" / TRASH)
        self._emptying = False
        self.quill = quill
        self.background = background
        self.gone = gone
        """Told each checkout tree removed (the provider drops what it got ready for it)."""
        self.live: dict[Key, Checkout] = {}
        """The checkout of each workspace in memory (not those built at an older version),
        least recently used first: at most ``in_memory`` idle ones."""
        self.in_memory = IN_MEMORY
        self.locks = KeyLocks()
        """One lock per checkout someone holds or waits for (none for an idle one)."""
        self.reserve = disk.Reserve(data_dir, reserve)
        self.budget = disk.Budget(budget)
        self.ceiling = budget if ceiling is None else min(ceiling, budget)
        self.watch = disk.Watch(self.reserve)
        """Free space while commands run (``disk.Watch``)."""
        self.pinned: dict[Path, int] = {}
        """The bytes of each checkout built at an older version, while a command uses it."""
        self.using: Counter[Key] = Counter()
        """Requests in hand per checkout (one in use, or waited for, is never evicted)."""
        self.over_quota: dict[Key, int] = {}
        """Checkouts over their quota with only what the log holds, at that version."""
        self.measured: dict[Key, tuple[int, int]] = {}
        """Per checkout a command ended in normally: (version after it, bytes it held then),
        so that the next command at that version need not walk it again."""
        self.entries: dict[Key, int] = {}
        """The entries (inodes) each checkout held when last walked: with its bytes, what a
        command starts from for the disk watch (no walk of its own)."""
        self._nuid = NUID()
        self._own: dict[Key, tuple[int, int]] = {}
        """The manifest files' (bytes, entries) when a command over an overlay started (what
        the command does to them is added when it is done, no walk)."""

    def __len__(self) -> int:
        return len(self.live)

    def new(self, home: Path, address: Address, *, live: bool = False) -> Checkout:
        """A checkout of ``address`` at ``home`` (not opened); ``live``: the workspace's own
        (``hold``), which a fork's first may build from its source's (hard links, over
        overlays only)."""
        ws = self.quill.workspace(f"{address.tenant}/{address.workspace}")
        links = self.links()

        async def fetch(path: str, version: int) -> bytes:
            return await ws.read_bytes(path, version=version)

        async def tree(after: str | None, version: int | None, base: int | None = None) -> TreePage:
            async with asyncio.timeout(TREE_WAIT_S):  # no reader: replayed from the log
                got = ws.tree(after=after, limit=TREE_PAGE, version=version, changed_from=base)
                return await got

        return Checkout(
            home,
            address.tenant,
            address.workspace,
            self.js,
            self.subjects,
            self.blobs,
            fetch,
            owner=self.owner,
            trash=self.trash,
            tree=tree,
            changed=tree,
            source=functools.partial(self.source_of, address.tenant) if live and links else None,
            links=links,
        )

    @contextlib.asynccontextmanager
    async def source_of(
        self, tenant: str, workspace: str, version: int
    ) -> AsyncIterator[Checkout | None]:
        """A fork's source's checkout, held (no command changes it meanwhile) while a fork's
        first checkout links its files: the one in memory, if no request holds or waits for
        it (never waited for: else None, and the fork's is built from a reader)."""
        key = (tenant, workspace)
        checkout = self.live.get(key)
        if checkout is None or key in self.locks or key in self.using or checkout.version == 0:
            yield None
            return
        async with self.locks(key):
            same = self.live.get(key) is checkout
            dirty = await asyncio.to_thread((checkout.home / "dirty").exists)
            yield checkout if same and not dirty else None

    @contextlib.asynccontextmanager
    async def hold(self, address: Address) -> AsyncIterator[Checkout]:
        """The workspace's checkout, synced to the latest version, within its quota, held
        exclusively; idle checkouts over the budget are evicted once it is released. The
        disk's room was looked at once already, as the request came (``room``).

        Raises:
            QuillError: ``UNAVAILABLE`` (the log), ``WORKSPACE_NOT_FOUND``,
                ``SIZE_LIMIT_EXCEEDED`` (the log's files alone are over the quota).
        """
        key = (address.tenant, address.workspace)
        self.using[key] += 1
        done = False
        try:
            async with self.locks(key):
                checkout = self.live.pop(key, None)
                if checkout is None:
                    home = self.data_dir / "checkouts" / address.tenant
                    checkout = self.new(home / address.workspace, address, live=True)
                    await asyncio.to_thread(checkout.open)
                self.live[key] = checkout  # the most recently used
                await self.sync(checkout)
                if checkout.version == 0:  # none (or purged): nothing of it is kept
                    await self._remove(key)
                    raise no_workspace(address.tenant, address.workspace)
                await self.within_quota(key, checkout)
                yield checkout
                own = self._own.pop(key, None)
                if own is not None and key in self.budget.sizes:  # the manifest's, since
                    now = await asyncio.to_thread(checkout.own_files)
                    self.budget.used(key, self.budget.sizes[key] + now[0] - own[0])
                    self.entries[key] = self.entries.get(key, 0) + now[1] - own[1]
                self.measured[key] = (checkout.known, self.budget.sizes.get(key, 0))
            done = True
        finally:
            self.using[key] -= 1
            if self.using[key] <= 0:
                del self.using[key]
            if not done:  # failed or cancelled: evict in the background
                self.background(self.evict())
            self.tidy()
        await self.evict()  # before the reply: its sender sees the budget kept

    async def sync(self, checkout: Checkout) -> None:
        try:
            await checkout.sync()
        except Exception as exc:
            raise QuillError(ErrorCode.UNAVAILABLE, f"The log is not reachable: {exc}") from exc

    async def within_quota(self, key: Key, checkout: Checkout) -> None:
        """Before a command: a checkout over its quota drops what the log does not hold (it
        is rebuilt from the log); still over, the command is refused."""
        allowed = self.quota_of(checkout)
        limit = allowed.bytes
        known = self.measured.pop(key, None)  # kept only by a command that ended normally
        if known is not None and known[0] == checkout.version and key in self.entries:
            used = known[1]  # nothing changed it since
        else:
            used, self.entries[key] = await quota.measure_held(checkout.home)
        if used > limit and self.over_quota.get(key) != checkout.version:
            log.warning("checkout %s/%s over its quota (%d bytes): rebuilt", *key, used)
            await asyncio.to_thread(checkout.reset)
            await self.sync(checkout)
            used, self.entries[key] = await quota.measure_held(checkout.home)
        self.budget.used(key, used)
        if used > limit:  # not rebuilt again until the log changes
            self.over_quota[key] = checkout.version
            raise quota.OverQuota(used, allowed).refused()
        self.over_quota.pop(key, None)

    def quota_of(self, checkout: Checkout) -> quota.Allowed:
        """Its workspace's ``max_checkout_bytes``, at most the executor's ceiling."""
        asked = checkout.limits.max_checkout_bytes
        if asked <= self.ceiling:
            return quota.Allowed(asked)
        return quota.Allowed(self.ceiling, asked=asked)

    def file_bytes(self, checkout: Checkout) -> int:
        """The largest file a command on ``checkout`` may write (its RLIMIT_FSIZE): no more
        than the checkout may hold, the whole budget, or the free space beyond the reserve
        now (a single ``write`` or ``fallocate`` then cannot take the log's room)."""
        try:
            free, reserve = self.reserve.space()
        except OSError:
            free, reserve = self.budget.budget, 0
        room = max(1, free - reserve)
        return min(self.quota_of(checkout).bytes, self.budget.budget, room)

    def _allowance(self, key: Key, checkout: Checkout, live: bool, started: int) -> quota.Allowance:
        """What ``checkout`` may hold at each sample of a command on it (``quota.guard``):
        its quota, or less: what the budget leaves beside the others (idle ones evicted
        first, least recently used first), never less than it held at the start."""
        wanted = self.quota_of(checkout)

        async def allowance(used: int) -> quota.Allowed:
            if live:
                self.budget.used(key, used)
            else:
                self.pinned[checkout.home] = used
            room = self._room(key if live else None, checkout.home)
            if used > room:
                for idle in self.budget.idle(lambda k: k in self.using or k == key):
                    await self.drop(idle)
                    room = self._room(key if live else None, checkout.home)
                    if used <= room:
                        break
            room = max(room, started)
            if room < wanted.bytes:
                return quota.Allowed(room, "checkouts_budget", asked=wanted.bytes)
            return wanted

        return allowance

    def _room(self, key: Key | None, home: Path) -> int:
        """What the budget leaves one checkout beside the others (idle, in use, pinned)."""
        pinned = sum(b for h, b in self.pinned.items() if h != home)
        return self.budget.budget - self.budget.others(key) - pinned

    async def guarded(
        self,
        checkout: Checkout,
        work: Awaitable[T],
        also: tuple[Path, ...] = (),
        merged: list[Merged | None] | None = None,
    ) -> T:
        """``work`` (a command on ``checkout``) stopped if the checkout goes over what it may
        hold (``allowance``), or grows the most while the disk is under its reserve
        (``disk.Watch``; ``also``: other directories the command writes to): then its changes
        are discarded (the checkout is rebuilt from the log next time). ``merged``: ``work``
        runs its command over an overlay (its result is the sandbox's ``Outcome``); once it
        ended, its layer is merged into the checkout and the merge appended (None: it had no
        layer). What the checkout holds is then what it held plus its layers, then what the
        merge changed: never a walk of it (``layered``).

        Raises:
            QuillError: ``SIZE_LIMIT_EXCEEDED`` when it was stopped or ended over the quota.
        """
        key = (checkout.tenant, checkout.workspace)
        live = self.live.get(key) is checkout  # not one built at an older version
        started: tuple[int, int] | None = None
        measure: Callable[[], tuple[int, int]] | None = None
        watch = checkout.watch if merged is None else None
        if watch is not None:  # a shell's: its watch's running total, never a walk of tree/
            measure = await asyncio.to_thread(quota.watched, checkout.home, watch)
            started = await asyncio.to_thread(measure)
        elif live and key in self.budget.sizes and key in self.entries:
            started = (self.budget.sizes[key], self.entries[key])  # walked before it: no walk
        else:
            started = await quota.measure_held(checkout.home)
        allowance = self._allowance(key, checkout, live, started[0])
        then = None
        if merged is not None:
            also = (*also, self.layers_of(checkout.home))  # where the command's writes go
            if live:
                self._own[key] = await asyncio.to_thread(checkout.own_files)
            measure = layered(checkout.home, self.layers_of(checkout.home), started, merged)
            then = self._merging(checkout, merged)
        try:
            result, (used, entries) = await quota.guard(
                checkout.home,
                allowance,
                work,
                watch=self.watch,
                started=started,
                also=also,
                measure=measure,
                then=then,
            )
        except (quota.OverQuota, quota.DiskShort) as over:
            try:
                await asyncio.to_thread(checkout.reset)
                if live:
                    used, self.entries[key] = await quota.measure_held(checkout.home)
                    self.budget.used(key, used)
            finally:
                if isinstance(over, quota.DiskShort):
                    over.release()  # the space it took is free: the watch may stop another
            raise over.stopped() from None
        finally:
            self.pinned.pop(checkout.home, None)
        if live:
            self.budget.used(key, used)
            self.entries[key] = entries
        return result

    def layers_of(self, home: Path) -> Path:
        """Where the overlay layers of the checkout at ``home`` are."""
        return overlay.layer_dir(self.data_dir / "checkouts", home)

    @staticmethod
    def _merging(
        checkout: Checkout, merged: list[Merged | None]
    ) -> Callable[[Any], Awaitable[None]]:
        async def merge(outcome: Any) -> None:
            layer = getattr(outcome, "layer", None)
            if layer is None:
                merged.append(None)
                return
            # the tree is changed by a thread: it finishes before anything else touches it,
            # even when the executor is stopping meanwhile
            done = asyncio.ensure_future(asyncio.to_thread(checkout.merge, layer))
            try:
                merged.append(await asyncio.shield(done))
            except asyncio.CancelledError:
                await asyncio.wait({done})
                raise
            except BaseException:
                await asyncio.to_thread(checkout.reset)  # half merged: rebuilt from the log
                raise

        return merge

    async def room(self) -> None:
        """Refuse (``UNAVAILABLE``) when the data disk is short of its reserve, after evicting
        what idle checkouts can go: once per request, as it comes, before it waits for a slot
        (another executor may take it; a command that then fills the disk is the disk watch's,
        ``disk.Watch``)."""
        if not self.reserve.short():
            return
        for key in self.budget.idle(self.using.__contains__):
            if not self.reserve.short():
                return
            await self.drop(key)
        self.reserve.check()

    async def evict(self) -> None:
        """Evict idle checkouts, least recently used first, until within the budget; forget
        idle ones past ``in_memory`` (they stay on disk)."""
        for key in self.budget.over(self.using.__contains__):
            await self.drop(key)
        excess = len(self.live) - self.in_memory
        for key in [k for k in self.live if k not in self.using]:
            if excess <= 0:
                break
            del self.live[key]
            excess -= 1

    async def drop(self, key: Key) -> None:
        if key in self.using:  # taken since: it stays
            return
        async with self.locks(key):  # free: taken at once; a request arriving now waits for it
            await self._remove(key)
        log.info("checkout %s/%s evicted (idle, over the checkouts budget or disk reserve)", *key)

    async def _remove(self, key: Key) -> None:
        checkout = self.live.pop(key, None)
        self.over_quota.pop(key, None)
        self.measured.pop(key, None)
        self.entries.pop(key, None)
        home = checkout.home if checkout else self.data_dir / "checkouts" / key[0] / key[1]
        self.gone(home / "tree")
        await self._discard(home)
        with contextlib.suppress(OSError):  # its directory of layers, empty: no command runs
            self.layers_of(home).rmdir()
        self.budget.forget(key)

    async def purged(self, key: Key) -> None:
        """The workspace was purged: its checkout goes, once no command holds it (one that
        does finds the purge when it commits, and its checkout is wiped at its next sync)."""
        async with self.locks(key):
            await self._remove(key)
        log.info("checkout %s/%s removed: the workspace was purged", *key)

    async def _gone(self, key: Key) -> bool:
        """Whether the log holds nothing of the workspace but its purge (or nothing)."""
        try:
            last = await self.js.get_last_msg(STREAM_EVENTS, self.subjects.evt(*key))
        except NotFoundError:
            return True
        except Exception:  # the log is not reachable: keep it, the next sync decides
            return False
        return isinstance(codec.decode_event(last.data or b""), WorkspacePurged)

    async def found(self) -> None:
        """The checkouts an earlier executor left count against the budget (and are evicted
        first); pinned-version ones it left half-used are removed."""
        checkouts = self.data_dir / "checkouts"
        await self._discard(checkouts / AT)
        await self._discard(checkouts / overlay.LAYERS)  # what commands cut short wrote
        for key, home in await asyncio.to_thread(disk.found, checkouts):
            if await self._gone(key):  # purged while no executor was here to hear it
                await self._remove(key)
                continue
            used, self.entries[key] = await quota.measure_held(home)
            self.budget.used(key, used)
        await self.evict()
        self.tidy()  # what this or an earlier executor left in the trash

    async def _discard(self, path: Path) -> None:
        """Move ``path`` to the trash and remove it (``Trash.discard``); a failure is logged,
        never raised (the trash keeps what it could not remove); the rest in the background."""
        try:
            await asyncio.to_thread(self.trash.discard, path)
        except Exception as exc:
            log.warning("cannot remove %s (%s): left in place", path, exc)
        self.tidy()

    def tidy(self) -> None:
        """Empty the trash in the background (one task at a time), if it holds anything."""
        if self._emptying or not self.trash.pending():
            return
        self._emptying = True
        self.background(self._empty())

    async def close(self) -> None:
        """Stop removing what the trash holds (the rest waits for the next start)."""
        await asyncio.to_thread(self.trash.close)

    async def _empty(self) -> None:
        try:
            while not await asyncio.to_thread(self.trash.empty):
                pass
        finally:
            self._emptying = False

    def info(self) -> dict[str, Any]:
        try:
            (free, reserve), (inodes, inode_reserve) = self.reserve.space(), self.reserve.inodes()
            short = free < reserve or inodes < inode_reserve
        except OSError:
            free = reserve = inodes = inode_reserve = -1
            short = False
        return {
            "checkouts_bytes": self.budget.total + sum(self.pinned.values()),
            "checkouts_budget": self.budget.budget,
            "max_checkout_bytes": self.ceiling,
            "disk_watch_stops": self.watch.stops,
            "disk_free_bytes": free,
            "disk_reserve_bytes": reserve,
            "disk_free_inodes": inodes,
            "disk_reserve_inodes": inode_reserve,
            "refusing": "disk_reserve" if short else None,
        }

    @contextlib.asynccontextmanager
    async def at(
        self, checkout: Checkout, address: Address, req: rq.Execution
    ) -> AsyncIterator[Checkout]:
        """The checkout to run ``req`` in: the live one, or one built at an older version."""
        latest = checkout.version
        for wanted in (req.version, req.min_version):
            if wanted is not None and wanted > latest:
                raise no_version(wanted, latest)
        if req.version is None or req.version == latest:
            yield checkout
            return
        if req.version < checkout.manifest.floor:
            what = f"{address.tenant}/{address.workspace}"
            raise compaction.trimmed(what, req.version, checkout.manifest.floor)
        temp = self.data_dir / "checkouts" / AT / self._nuid.next().decode()
        past = self.new(temp, address)
        try:
            await asyncio.to_thread(past.open)
            await past.sync(req.version)
            yield past
        finally:
            await self._discard(temp)


LAYER_OWN_BYTES = 8 * 4096
"""What a layer's own directories hold (8 directory blocks at most) before a command writes."""


def layered(
    home: Path, layers: Path, started: tuple[int, int], merged: list[Merged | None]
) -> Callable[[], tuple[int, int]]:
    """What a checkout at ``home`` holds while a command runs over an overlay
    (``Spawn.overlay``): what it held when the command started (``started``) and its layers
    (what the command wrote, besides the files it replaced, still in ``tree/``); once merged,
    what it held and what the merge changed. A command that had no layer after all wrote into
    ``tree/``: a walk."""

    def measure() -> tuple[int, int]:
        if merged and merged[0] is not None:
            return started[0] + merged[0].grown, started[1] + merged[0].entries
        if merged:
            return quota.held(home)
        more = quota.held(layers)
        # the layer's own directories (its parent, upper, work and overlayfs's work/work and
        # index) are the executor's, not the command's growth: a command that changes nothing
        # is not stopped by them on a tight budget
        return started[0] + max(0, more[0] - LAYER_OWN_BYTES), started[1] + more[1]

    return measure


class KeyLocks:
    """A lock per key, kept only while someone holds it or waits for it: a key no one asks
    for again leaves nothing behind (an executor serving a million workspaces over its life
    keeps none of their locks)."""

    def __init__(self) -> None:
        self._held: dict[Key, tuple[asyncio.Lock, int]] = {}

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, key: Key) -> bool:
        """Someone holds ``key``'s lock or waits for it."""
        return key in self._held

    @contextlib.asynccontextmanager
    async def __call__(self, key: Key) -> AsyncIterator[None]:
        lock, users = self._held.get(key, (None, 0))
        if lock is None:
            lock = asyncio.Lock()
        self._held[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            _, users = self._held[key]
            if users <= 1:
                del self._held[key]
            else:
                self._held[key] = (lock, users - 1)
