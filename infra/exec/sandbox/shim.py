"""A bwrap sandbox's first process (``SHIM``) and the command it is handed (``spec``).

Only ``bwrap`` uses this module; the shim's other side (waiting for it, handing the command
over, reading its report) is ``box``.

How a command gets in. Every sandbox is started before its command is handed over: its first
process (after ``setpriv``, ``users``) is ``SHIM``, which says it is ready and waits; the
provider sets the command's limits on it (``prlimit(2)``, as util-linux ``prlimit`` would),
writes the command into a memfd the shim holds, and lets it go. A sandbox started for the
command it runs goes through the same steps at once; a spare (``BwrapProvider.warm``,
``spares``) has them done ahead. The environment is the command's own (``env -i``, or exactly
what bash exports: ``_exported``).
"""

from __future__ import annotations

import os
import re

from infra.exec.sandbox import common
from infra.exec.sandbox.interface import SandboxError, Spawn

SHIM = (
    "go=$1 spec=$2 rep=$3; printf 'R\\n' >&\"$rep\"; "
    'IFS= read -r -n 1 x <&"$go" || exit 125; exec {go}<&-; '
    "mapfile -t -d '' -u \"$spec\" a; exec {spec}<&-; "
    'cd -- "${a[0]}" 2>/dev/null || { printf "E %s\\n" "${a[0]}" >&"$rep"; exit 125; }; '
    'count=${a[1]} k=${a[2]} n=${a[3]}; set -- "${a[@]:4}"; '
    'if [ "$count" = 0 ]; then exec {rep}>&-; exec "$@"; fi; '
    "trap : TERM; exec {err}>&2 2>/dev/null; "
    'if [ "$k" = - ]; then "$@" 2>&"$err" {err}>&- {rep}>&-; else '
    '( unset -v "${@:1:k}"; set -- "${a[@]:4+k+n}"; export -- "${a[@]:4+k:n}"; exec -- "$@" ) '
    '2>&"$err" {err}>&- {rep}>&-; fi; status=$?; n=0; '
    "for d in /proc/[0-9]*; do p=${d#/proc/}; "
    '[ "$p" = 1 ] || [ "$p" = "$$" ] && continue; '
    'line=; read -r line 2>/dev/null < "$d/stat" || continue; line=${line##*) }; '
    "case ${line%% *} in Z|X) ;; *) n=$((n + 1)) ;; esac; done; "
    'printf "%d\\n" "$n" >&"$rep"; exit "$status"'
)
"""A bwrap sandbox's first process (after ``setpriv``: the sandbox's root when the executor is
root), ``bash -c SHIM quill GO SPEC REPORT``:
says it is ready (``R`` on REPORT), waits for a byte on GO, then reads the command from SPEC
(a memfd the provider has filled meanwhile: the directory, whether to count what is left, K and
N, then either ``env -i -- NAME=VALUE... argv...`` (K is ``-``) or the K names the shim
exports, the command's N ``NAME=VALUE`` and its argv; each ending in NUL), closes GO and SPEC,
enters the directory (else reports ``E <directory>``) and runs the command (as root, through
``setpriv`` to uid 1000: the SPEC's argv starts with it) with exactly its environment: through
``env -i``, or (``bash -c``, and ``_exported``: names bash exports as
given; a missing program would be reported in bash's words, not env's) from a
subshell that unsets what the shim exports, exports the command's and execs it, one exec less
(bash's ``exec`` adds no ``_``, and in a subshell it sets no ``SHLVL``).
Counting (``Spawn.count_left``) it runs it as a child (without REPORT; SIGTERM on a timeout is
the command's to take or ignore: the shim's trap, set just before, only lets it wait for it;
until then SIGTERM ends the shim as it would the command, and its own
stderr, where bash would say "Terminated", is /dev/null), then counts the processes of the PID
namespace still alive but its init (pid 1) and itself, and writes the number to REPORT before
exiting with the command's status. Its exit is what ends the sandbox (bwrap's init follows, the
kernel kills the rest), so it is the one place that sees what is left before it goes. Not
counting, it execs the command. Its limits are set from the host (``prlimit``) before GO."""


def spec(
    cwd: str,
    spawn: Spawn,
    *,
    shims: str | None,
    base: dict[str, str],
    env_bin: str,
    command_user: list[str],
) -> bytes:
    """What ``SHIM`` reads: ``cwd``, whether to count, K, N, then ``env -i -- NAME=VALUE...
    argv...`` (K ``-``) or the K names to unset, the N ``NAME=VALUE`` and argv. ``shims``: the
    directory of the shim links on PATH, if any; ``base``: the environment the shim runs with
    (what it exports); ``command_user``: the argv the command runs through (``users``).

    Raises:
        SandboxError: what ``execve`` could not take (a NUL, ``=`` in a name), no program,
            or a program name with ``=`` (env would read it as a variable).
    """
    env = common.environment("/tmp", spawn.env, shims)
    if not spawn.argv or "=" in spawn.argv[0]:
        raise SandboxError(f"cannot start bwrap: no program to run in {spawn.argv[:1]}")
    pairs = [f"{name}={value}" for name, value in env.items()]
    if spawn.count_left and spawn.argv[0] == "bash" and _exported(env, base):
        unset = [*base, *_BASH_EXPORTS]
        argv = [*command_user, *spawn.argv]
        items = [cwd, "1", str(len(unset)), str(len(pairs)), *unset, *pairs, *argv]
    else:
        items = [cwd, "1" if spawn.count_left else "0", "-", "0", *command_user]
        items += [env_bin, "-i", "--", *pairs, *spawn.argv]
    if any("=" in name for name in env) or any("\0" in item for item in items):
        raise SandboxError("cannot start bwrap: a NUL byte, or '=' in a variable name")
    try:
        return b"".join(os.fsencode(item) + b"\0" for item in items)
    except (UnicodeError, TypeError) as e:
        raise SandboxError(f"cannot start bwrap: {e}") from e


_BASH_EXPORTS = ("PWD", "OLDPWD", "SHLVL")
"""What bash exports of its own (besides the environment it was given)."""
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SPECIAL = frozenset(
    "_ PWD OLDPWD SHLVL SHELLOPTS BASHOPTS PPID UID EUID GROUPS RANDOM SRANDOM SECONDS LINENO "
    "EPOCHSECONDS EPOCHREALTIME HISTCMD FUNCNAME DIRSTACK POSIXLY_CORRECT IFS OPTIND OPTARG "
    "OPTERR PS4 CDPATH GLOBIGNORE TEXTDOMAIN TEXTDOMAINDIR go spec rep x a count k n err "
    "status p d line".split()
)
"""Names bash treats as its own (read-only, dynamic, changing how it runs) and the shim's."""


def _exported(env: dict[str, str], base: dict[str, str]) -> bool:
    """Whether a bash exporting ``env`` (``SHIM``) hands the command exactly ``env``, as
    ``env -i`` does: plain names that are none of bash's own, the locale and PATH the base's
    (bash would warn of a locale it lacks; PATH finds the program as env would)."""
    for name, value in env.items():
        if not _NAME.fullmatch(name) or name in _SPECIAL or name.startswith(("BASH", "COMP_")):
            return False
        if (name.startswith("LC_") or name in ("LANG", "PATH")) and base.get(name) != value:
            return False
    return True
