"""The WS_BLOBS objects ``quill scrub`` (``scrub.py``) deletes: those of the workspace's own
namespace (``<tenant>/<workspace>/<sha256>``) that held a secret, always; a legacy one (named
by the bare sha256, shared by every workspace that wrote it before workspaces had their own)
unless another workspace (of any tenant) still names it (``scrub_stores.referrers`` reads every
other log once): that one is kept, and the workspaces that name it are said (scrub them too;
scrubbing the last of them deletes it)."""

from __future__ import annotations

import contextlib

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from contracts.subjects import BUCKET_BLOBS, Subjects
from core.secrets import Secrets
from infra.blobs import remove
from quill_cli.tools import scrub_stores as stores
from quill_cli.tools.scrub_redact import Redactor


async def present(js: JetStreamContext, shas: set[str]) -> set[str]:
    """Those of ``shas`` that are objects of WS_BLOBS (most contents were inline)."""
    obs, out = await js.object_store(BUCKET_BLOBS), set()
    for sha in shas:
        with contextlib.suppress(NotFoundError):
            if not (await obs.get_info(sha)).deleted:
                out.add(sha)
    return out


def _named(refs: dict[str, set[str]], kept: set[str], secrets: Secrets) -> tuple[int, list[str]]:
    """How many objects are kept, and the workspaces that name them (redacted)."""
    names = {name for sha in kept for name in refs.get(sha, ())}
    return len(kept), sorted(secrets.redact(name)[0] for name in names)


async def shared(
    js: JetStreamContext, subjects: Subjects, subject: str, shas: set[str], secrets: Secrets
) -> tuple[int, list[str]]:
    """For a dry run: how many blobs a scrub would keep, and the workspaces that name them."""
    refs, _ = await stores.referrers(js, subjects, subject, await present(js, shas))
    return _named(refs, set(refs), secrets)


async def delete(
    js: JetStreamContext, subjects: Subjects, subject: str, gone: set[str], redactor: Redactor
) -> tuple[int, int, list[str]]:
    """Delete the objects of ``gone`` from WS_BLOBS: from the workspace's namespace, and the
    legacy ones (bare sha256) except those another workspace names; how many were deleted,
    how many kept, and the workspaces that name the kept ones.

    The other logs are read once up to their end; what no one else names is deleted; then
    the events appended meanwhile are read: one that names a legacy object deleted meanwhile
    gets it back (and its workspace is named like the others)."""
    own = [await remove(js, redactor.blobs.name(sha)) for sha in sorted(gone)]
    found = await present(js, gone)
    refs, seen = await stores.referrers(js, subjects, subject, found)
    kept = set(refs)
    doomed = sorted(found - kept)
    originals = {sha: redactor.originals.get(sha) or await redactor.blobs.get(sha)
                 for sha in doomed}  # fmt: skip
    obs = await js.object_store(BUCKET_BLOBS)
    for sha in doomed:
        with contextlib.suppress(NotFoundError):
            await obs.delete(sha)
    late, _ = await stores.referrers(js, subjects, subject, set(doomed), start=seen + 1)
    for sha, names in late.items():
        await obs.put(sha, originals[sha])
        refs.setdefault(sha, set()).update(names)
        kept.add(sha)
    count, named = _named(refs, kept, redactor.secrets)
    return sum(own) + len(doomed) - len(late), count, named
