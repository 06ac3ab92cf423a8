"""Structured git actions (``GitCommand``) on a workspace's repository, run in the sandbox.

``run_git`` is called by the executor with the workspace's checkout; it returns a ``GitResult``
(``changes`` left for the executor to fill) or raises ``QuillError``:

    FILE_NOT_FOUND     no repository at ``workdir`` (or above it in the workspace); no branch
    INVALID_ARGUMENT   a missing or malformed field (message, branch, remote, url)
    ACCESS_DENIED      ``workdir`` leaves the workspace; a push to a host with no credential
    ALREADY_EXISTS     ``clone`` into a non-empty directory
    TIMEOUT            past ``timeout_ms`` (all the git runs of one action share it)
    EXECUTION_FAILED   git failed (the first lines of its stderr, redacted; ``exit_code``), or
                       the sandbox could not start it; ``commit`` with nothing staged is one:
                       message ``nothing to commit`` (a state of the repository, not a bad
                       request: the same request succeeds once something changed); a remote
                       refused or unreachable: always ``targets.UNREACHABLE``, no details

Paths in requests (``files``, ``path``) and in results (``GitStatus``) are workspace paths,
like everywhere in Quill (``proj/src/a.py`` for a repository at ``proj``).

Actions: ``status`` (porcelain v2; untracked directories as ``dir/``, as git shows them;
unmerged paths under ``unstaged``), ``diff`` (staged then unstaged; the smaller gets up to half
the cap), ``commit`` (``git add -A`` of ``files`` or of everything; the message kept verbatim
but for surrounding whitespace; no hooks run), ``checkout`` (``switch``, or ``switch -c`` from
HEAD), ``branch``, ``log`` (``output``: one line per commit), ``push`` (``branch``, default the
current one, to the same name on ``remote``; then ``refs/remotes/<remote>/<branch>``),
``pull`` (fetch ``branch`` of ``remote``, default the current one, fast-forward only),
``clone`` (``url`` into ``workdir``, which must be empty or absent; remote ``origin`` or
``remote``). ``output`` is capped at ``output_cap`` bytes of what git printed (cut at a
character boundary, invalid UTF-8 replaced), ``output_truncated`` says so.

Security
--------
The repository is untrusted: agents write ``.git/config``, hooks and ``.gitattributes``, and
git runs commands named there (hooks, ``core.fsmonitor``, ``filter.*``, ``diff.external``,
textconv, ``gpg.program``, ``credential.helper``, ``core.sshCommand``...). Hence:

1. Every git invocation goes through ``run`` (the sandbox), including the ones in the
   executor's scratch repositories; the executor itself only writes plain files (a scratch
   repository's ``HEAD``, ``config``, ``alternates``, a ref). Under the local provider ``run``
   is the host, unsandboxed: that provider isolates nothing.
2. Every invocation gets ``-c`` overrides (``running.HARDENING``) and an environment
   (``running.GIT_ENV``) that turn off what git would run or read on its own: hooks,
   fsmonitor, pager, editor, askpass, gpg, external diff, credential helpers, system and
   global config, prompts, every transport unless the run needs it (``running`` has the
   full list).
   In the workspace's own repository these are hygiene, not the boundary: that sandbox runs
   whatever the agent wants anyway (``RunCommand``), so ``.gitattributes`` filters stay on
   (git-lfs and friends work) and they run there, in the sandbox, like any agent code.
3. The boundary is that the credential never enters a sandbox that runs workspace-controlled
   code or reads workspace-controlled config. Network actions use scratch repositories in a
   temporary directory of the executor's, outside the workspace, whose config the executor
   writes itself; the URL is validated first; the token is given only to a credential helper
   scoped to the remote's protocol and host, reaches the sandbox on the standard input of
   the run and is redacted from everything git prints (``remote`` has the design step by
   step). The local provider has no isolation: there the token is kept from the workspace's
   git config and hooks (none runs in the credentialed run), not from other processes.
4. Network runs reach public addresses only, unless allow-listed, at the address the executor
   resolved and checked (pinned), and tell every refused or unreachable remote with the same
   error (``targets``).

Modules
-------
``credentials``  ``Credential``, ``Credentials``: configured per host, the token read at each use;
                 the allow-list (``[git] allow``)
``targets``      where network runs may connect: public addresses, the allow-list, pinning, the
                 one error of every refused or unreachable remote
``workspace``    workspace paths: the action's directory and repository, never outside
``running``      ``Git``: one action's runs (hardening, environment, identities, deadline,
                 redaction and capping of output); ``Runner``, ``sandbox_runner``
``local``        status, diff, commit, checkout, branch, log
``remote``       push, pull, clone: URL validation, scratch repositories, credential helper
``dispatch``     ``run_git``
"""

from infra.exec.git.credentials import Credential, Credentials
from infra.exec.git.dispatch import run_git
from infra.exec.git.running import Runner, sandbox_runner

READ_ONLY_GIT = frozenset({"status", "diff", "branch", "log"})
"""Git actions that change no file (run with GIT_OPTIONAL_LOCKS=0): nothing to capture."""

__all__ = ["READ_ONLY_GIT", "Credential", "Credentials", "Runner", "run_git", "sandbox_runner"]
