"""A fork's merge back, in the console (issue 33): each fork row of the Forks tab links to a
preview of merging that fork into the workspace (a dry run: the changes it would make, and
each conflict with both sides' entries and its three-way hunks, escaped as every page's
text), and its Merge form runs the merge with the strategy chosen as the logged-in principal,
through the op every door uses (``reach.merge``: both names reached, a pinned token never
merges). A restricted target parks the merge: the page says so and links the approval (an
approver decides it there, and Quill makes it). A form like the console's others (CSRF token,
same origin); a refusal (``MERGE_CONFLICT``) shows its conflicts, with 409.

The preview's conflicts are the writer's (the first 100, each side's hunk cut at 2 KiB, 256 KiB
of views in all: ``core.merge``); the page shows them all.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import msgspec
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from contracts import replies as rp
from contracts.errors import ErrorCode, QuillError
from contracts.merging import Conflict
from core.merge_words import KINDS, entry_words
from services.gateway.console.gate import PREFIX
from services.gateway.reach import STRATEGIES, merge

if TYPE_CHECKING:
    from services.gateway.console import Console

APPROVAL_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
"""An approval id (``contracts.requests``), as a redirect carries it back to the page."""
SAID_MOST = 300
"""Characters of a redirect's message the page shows at most."""


def _names(request: Request, source: object) -> tuple[str, str, str]:
    """The page's target and source as ``reach.merge`` takes them, and the source's bare
    name: the source is of the target's tenant (``tenant:name`` pages name theirs).

    Raises:
        QuillError: ``INVALID_ARGUMENT``: no source named.
    """
    if not isinstance(source, str) or not source.strip():
        raise QuillError(ErrorCode.INVALID_ARGUMENT, "Name the workspace to merge: ?from=<fork>")
    param = request.path_params["ws"]
    tenant, sep, _ = param.partition(":")
    name = source.strip()
    return param.replace(":", "/", 1), f"{tenant}/{name}" if sep else name, name


def _strategy(value: object) -> str:
    if value is None or value == "":
        return "fail"
    if value not in STRATEGIES:
        raise QuillError(ErrorCode.INVALID_ARGUMENT, f"strategy is one of {', '.join(STRATEGIES)}")
    return str(value)


def _context(plan: rp.Merged | None, conflicts: list[Conflict], total: int) -> dict[str, Any]:
    return {
        "plan": plan,
        "conflicts": conflicts,
        "conflicts_total": total,
        "entry": entry_words,
        "kinds": KINDS,
        "strategies": STRATEGIES,
    }


async def preview(c: Console, request: Request) -> Response:
    """``GET /ui/w/{ws}/merge?from=<fork>&strategy=``: the dry run, and the Merge form."""
    params = request.query_params
    target, source, name = _names(request, params.get("from"))
    strategy = _strategy(params.get("strategy"))
    plan, _ = await merge(c.access, c.principal(request), target, source, strategy, True)
    said = params.get("merged", "")[:SAID_MOST]
    parked = params.get("parked", "")
    context = _context(plan, plan.conflicts, plan.conflicts_total) | {
        "source": name,
        "strategy": strategy,
        "said": said,
        "parked": parked if APPROVAL_ID.fullmatch(parked) else "",
    }
    return c.page(request, "merge.html", context)


async def run(c: Console, request: Request) -> Response:
    """The Merge form: the merge made as the principal; then its preview page again, saying
    what it did (or that it waits for approval, linked); a refusal shows its conflicts."""
    form = await c.csrf.checked_form(request)
    target, source, name = _names(request, form.get("from"))
    strategy = _strategy(form.get("strategy"))
    where = f"{PREFIX}/w/{request.path_params['ws']}/merge"
    query = {"from": name, "strategy": strategy}
    try:
        done, version = await merge(c.access, c.principal(request), target, source, strategy,
                                    False)  # fmt: skip
    except QuillError as exc:
        if exc.code == ErrorCode.APPROVAL_REQUIRED:
            query["parked"] = str(exc.details.get("approval_id", ""))
            return RedirectResponse(f"{where}?{urlencode(query)}", status_code=303)
        if exc.code != ErrorCode.MERGE_CONFLICT:
            raise
        conflicts = msgspec.convert(exc.details.get("conflicts") or [], list[Conflict])
        total = exc.details.get("conflicts_total", len(conflicts))
        context = _context(None, conflicts, int(total)) | {
            "source": name,
            "strategy": strategy,
            "said": "",
            "parked": "",
            "refused": exc.message,
        }
        return c.page(request, "merge.html", context, status=409)
    if done.committed:
        said = f"Merged {done.source}@{done.from_version} into {done.workspace}: version {version}"
    else:
        said = f"Nothing to merge: {done.source}@{done.from_version} changes nothing here"
    query["merged"] = said
    return RedirectResponse(f"{where}?{urlencode(query)}", status_code=303)
