"""What a principal reaches among its tenant's workspaces: a page of them, one to archive or
purge, a fork and a merge (issue 33) — the rules every door (REST, MCP, the console) applies,
over who is calling (``access``).

A pinned token (``scope = "workspace"``) reaches its own workspace and nothing else: it lists
only that one, and may not archive, unarchive, purge, fork, list forks or merge (a fork or a
merge names a second workspace it could not reach; ``ACCESS_DENIED``, alike whether or not the
other exists). A tenant token reaches its tenant's workspaces; another tenant's are never
named. A fork and a merge stay within their tenant.
"""

from __future__ import annotations

from typing import Any

from contracts import replies as rp
from contracts.errors import ErrorCode, QuillError
from contracts.subjects import check_id, split_workspace
from quill.client import Quill, Workspace
from services.gateway.access import Access, Principal

PAGE = 100
"""Workspaces a listing's page holds unless the caller asks for more or fewer."""


def _denied(principal: Principal, what: str) -> QuillError:
    return QuillError(
        ErrorCode.ACCESS_DENIED,
        f"Access denied: this token reaches only its own workspace ({principal.name}) and may "
        f"not {what} workspaces",
    )


async def listing(
    access: Access, principal: Principal, after: str | None, limit: int, prefix: str | None
) -> rp.WorkspaceList:
    """A page of the principal's tenant's workspaces; a pinned token's own alone.

    Raises:
        QuillError: ``INVALID_ARGUMENT`` for a bad cursor, limit or prefix.
    """
    client = _client(access, principal)
    if not principal.pinned:
        return await client.workspaces(principal.tenant, after=after, limit=limit, prefix=prefix)
    own = await client.workspaces(principal.tenant, prefix=principal.workspace, limit=1)
    mine = [w for w in own.workspaces if w.workspace == principal.workspace]
    if after is not None and after >= principal.workspace:
        mine = []
    if prefix and not principal.workspace.startswith(prefix):
        mine = []
    return rp.WorkspaceList(tenant=principal.tenant, workspaces=mine, next=None)


def _client(access: Access, principal: Principal) -> Quill:
    return access.quill.as_actor(principal.actor)


def target(access: Access, principal: Principal, name: str, what: str) -> Workspace:
    """The workspace ``name`` of the principal's tenant, to ``what`` (archive, purge...); never
    created on the way.

    Raises:
        QuillError: ``ACCESS_DENIED`` for a pinned token; ``INVALID_ARGUMENT`` for a bad name.
    """
    if principal.pinned:
        raise _denied(principal, what)
    check_id("workspace", name)
    return _client(access, principal).workspace(f"{principal.tenant}/{name}")


def _named(principal: Principal, name: str | None) -> str:
    """``tenant/workspace`` of ``name`` as the principal names it: none for its own, an id of
    its tenant, or (``anywhere`` only) ``tenant/workspace``; never created on the way.

    Raises:
        QuillError: ``INVALID_ARGUMENT`` for a bad name (another tenant's, for a principal
            that does not reach ``anywhere``).
    """
    if not name:
        return principal.name
    tenant, _, rest = name.rpartition("/")
    if tenant and principal.anywhere:
        return f"{check_id('tenant', tenant)}/{check_id('workspace', rest)}"
    return f"{principal.tenant}/{check_id('workspace', name)}"


async def fork(
    access: Access, principal: Principal, source: str | None, new: str, version: int | None
) -> rp.Forked:
    """Fork ``source`` (the principal's own when None) at ``version`` (its latest) as ``new``,
    a workspace of the source's tenant (issue 33): every door's fork (MCP ``fork_workspace``,
    REST ``POST /v1/workspaces/{name}/fork``, the console's form).

    The principal must reach both names: a pinned token (``scope = "workspace"``) reaches
    only its own workspace, so it could not reach the fork it would make, and may not fork
    (``ACCESS_DENIED``, whether or not the source exists: nothing leaks); a tenant token forks
    within its tenant; another tenant's workspace is never named (``INVALID_ARGUMENT``).
    Answered once the reader has the fork (the source's forks listing shows it).

    Raises:
        QuillError: ``ACCESS_DENIED`` (pinned token), ``INVALID_ARGUMENT`` (a bad name, another
            tenant, no such version), ``ALREADY_EXISTS``, ``WORKSPACE_NOT_FOUND``,
            ``VERSION_TRIMMED`` (the writer's refusals, ``core/decide_fork.py``).
    """
    if principal.pinned:
        raise _denied(principal, "fork")
    named = _named(principal, source)
    target = new if "/" in new and principal.anywhere else named.split("/")[0] + "/" + new
    split_workspace(target)  # a bad name is refused before anything is sent
    client = access.quill.as_actor(principal.actor, session=principal.session)
    done = await client.fork(named, target, version=version)
    await client.workspace(target).info()  # the replica has it: listings show the fork
    return done


async def forks(access: Access, principal: Principal, name: str | None, limit: int) -> rp.ForkList:
    """The forks of ``name`` (the principal's own when None), as ``fork`` reaches it: a pinned
    token lists none (their names are other workspaces of its tenant, which it does not see).

    Raises:
        QuillError: ``ACCESS_DENIED`` (pinned token), ``INVALID_ARGUMENT`` (a bad name),
            ``WORKSPACE_NOT_FOUND``.
    """
    if principal.pinned:
        raise _denied(principal, "list the forks of")
    return await _client(access, principal).workspace(_named(principal, name)).forks(limit=limit)


STRATEGIES = ("fail", "ours", "theirs", "markers")
"""A merge's strategies (``contracts.requests.MergeWorkspace.strategy``)."""


async def merge_into(
    principal: Principal, ws: Workspace, source: str, strategy: str, dry_run: bool
) -> tuple[rp.Merged, int]:
    """Merge ``source`` (a workspace of ``ws``'s tenant, named as the principal names one)
    into ``ws``, a workspace the principal reached (issue 33); with the version ``ws`` has
    after it. The rule of ``fork``: both names reached, so a pinned token never merges.

    Raises:
        QuillError: ``ACCESS_DENIED`` (pinned token), ``INVALID_ARGUMENT`` (a bad name or
            strategy, another tenant's), ``APPROVAL_REQUIRED`` (a restricted target: parked),
            ``MERGE_CONFLICT``, ``NO_MERGE_BASE``, ``WORKSPACE_NOT_FOUND`` (the writer's).
    """
    if principal.pinned:
        raise _denied(principal, "merge")
    if strategy not in STRATEGIES or not isinstance(dry_run, bool):
        raise QuillError(
            ErrorCode.INVALID_ARGUMENT,
            f"strategy is one of {', '.join(STRATEGIES)}; dry_run is true or false",
        )
    if not isinstance(source, str) or not source:
        raise QuillError(ErrorCode.INVALID_ARGUMENT, "Name the workspace to merge (from)")
    named = _named(principal, source)
    done = await ws.merge(named, strategy=strategy, dry_run=dry_run)  # type: ignore[arg-type]
    return done, ws.last_version


async def merge(
    access: Access,
    principal: Principal,
    target: str | None,
    source: str,
    strategy: str,
    dry_run: bool,
) -> tuple[rp.Merged, int]:
    """``merge_into`` the workspace ``target`` names (the principal's own when None): REST's
    ``POST /v1/workspaces/{target}/merge`` and the console's Merge form; MCP's
    ``merge_workspace`` reaches its target through its session first."""
    if principal.pinned:
        raise _denied(principal, "merge")
    client = access.quill.as_actor(principal.actor, session=principal.session)
    ws = client.workspace(_named(principal, target))
    return await merge_into(principal, ws, source, strategy, dry_run)


def summary_json(w: rp.WorkspaceSummary) -> dict[str, Any]:
    """A workspace of a listing as REST and MCP's ``list_workspaces`` show it."""
    return {
        "name": w.workspace,
        "version": w.version,
        "files": w.files,
        "size": w.total_bytes,
        "createdAt": _iso(w.created),
        "updatedAt": _iso(w.updated),
        "updatedBy": w.updated_by,
        "lastOp": w.last_op,
        "trust": w.trust,
        "lockHolder": w.lock_holder,
        "archived": w.archived,
    }


def _iso(at: Any) -> str:
    return str(at.isoformat().replace("+00:00", "Z"))
