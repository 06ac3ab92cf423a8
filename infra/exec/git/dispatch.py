"""``run_git``: one ``GitCommand``, from the request to the ``GitResult``."""

from __future__ import annotations

import time
from pathlib import Path

from contracts import paths
from contracts.errors import ErrorCode, QuillError
from contracts.replies import GitResult
from contracts.requests import GitCommand
from infra.exec.git import local, remote
from infra.exec.git.credentials import Credentials
from infra.exec.git.running import DEFAULT_TIMEOUT_S, GIT_ENV, Git, Runner, identity
from infra.exec.git.workspace import find_repo


async def run_git(
    req: GitCommand,
    *,
    checkout: Path,
    run: Runner,
    actor: str | None,
    credentials: Credentials,
    output_cap: int,
    scratch: Path | None = None,
    owner: tuple[int, int] | None = None,
) -> GitResult:
    """Run one git action against the repository at ``req.workdir`` in ``checkout``.

    ``run`` runs each git process in the sandbox; ``scratch`` is where the network actions
    make their temporary repositories (default: the system's temporary directory), outside
    the checkout, given to ``owner`` (``Provider.owner``). The result's ``changes`` is None
    (the executor captures them).

    Raises:
        QuillError: see the docstring of ``infra.exec.git``.
    """
    timeout_s = req.timeout_ms / 1000 if req.timeout_ms is not None else DEFAULT_TIMEOUT_S
    workdir = paths.normalize(req.workdir)
    env = {**GIT_ENV, **identity(actor)}
    if req.action in ("status", "diff", "branch", "log"):
        env["GIT_OPTIONAL_LOCKS"] = "0"
    if req.action == "clone":
        workdir_found, repo = workdir, workdir
    else:
        workdir_found, repo = find_repo(checkout, workdir)
    g = Git(
        checkout=checkout,
        run=run,
        workdir=workdir_found,
        repo=repo,
        cap=output_cap,
        timeout_s=timeout_s,
        deadline=time.monotonic() + timeout_s,
        env=env,
        owner=owner,
    )
    match req.action:
        case "status":
            return await local.status(g)
        case "diff":
            return await local.diff(g, req.path)
        case "commit":
            return await local.commit(g, req.message, req.files)
        case "checkout":
            return await local.checkout(g, req.branch)
        case "branch":
            return await local.branches(g)
        case "log":
            return await local.log(g, req.limit, req.path)
        case "push":
            return await remote.push(g, req, credentials, scratch)
        case "pull":
            return await remote.pull(g, req, credentials, scratch)
        case "clone":
            return await remote.clone(g, req, credentials, scratch)
    raise QuillError(ErrorCode.INVALID_ARGUMENT, f"Unknown git action: {req.action}")
