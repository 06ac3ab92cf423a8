"""A seccomp filter for the bwrap sandbox: no setuid or setgid bit through chmod, no kernel keys,
no ``fallocate`` but to punch holes.

Only ``bwrap`` uses this module. Every file of the checkout belongs to the command's host uid,
so without this filter it could make one of them a setuid program of that uid on the host
(write a program, ``chmod 4755``) for any local user to run. ``chmod``, ``fchmod``,
``fchmodat`` and ``fchmodat2`` with S_ISUID or S_ISGID in the mode fail with EPERM.

The kernel's keyrings are not namespaced by anything a sandbox has of its own: every sandbox
runs as the same host uid, and ``/proc/keys`` lists every key that uid may view, whichever
sandbox added it (one tenant read another's key descriptions). ``add_key``, ``request_key``
and ``keyctl`` fail with EPERM: no command adds, finds or reads a key.

``fallocate`` fails with EOPNOTSUPP unless its mode punches a hole (which frees blocks): it
takes gigabytes of the disk the checkout shares with the log in microseconds (measured here:
20 GB/s on tmpfs, more on ext4, where it only marks extents), faster than any sampling of the
checkout can stop; writing the same bytes runs at the speed of memory, which the executor's
disk watch outruns (``services/executor/disk.py``). EOPNOTSUPP is what a filesystem without
``fallocate`` answers, so programs fall back by themselves (glibc's ``posix_fallocate`` writes
the blocks instead).

Every other call is allowed. Covers x86_64 (with its i386 and x32 ABIs) and aarch64 (with its
32-bit ARM ABI); elsewhere ``program()`` returns None.
"""

from __future__ import annotations

import errno
import platform
import stat
import struct

_LD_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_AND = 0x54  # BPF_ALU | BPF_AND | BPF_K
_JEQ = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JSET = 0x45  # BPF_JMP | BPF_JSET | BPF_K
_RET = 0x06  # BPF_RET | BPF_K
_ALLOW = 0x7FFF0000  # SECCOMP_RET_ALLOW
_DENY = 0x00050000 | errno.EPERM  # SECCOMP_RET_ERRNO
_NR, _ARCH = 0, 4  # offsets in struct seccomp_data; args[i] at 16 + 8 i (low half first)
_X32_BIT = 0x40000000
_SETID = stat.S_ISUID | stat.S_ISGID
_NO_FALLOCATE = 0x00050000 | errno.EOPNOTSUPP  # SECCOMP_RET_ERRNO
_PUNCH_HOLE = 0x02  # FALLOC_FL_PUNCH_HOLE

# per architecture (AUDIT_ARCH_*): fallocate's syscall number (its mode is argument 1)
_FALLOCATE = {0xC000003E: 285, 0x40000003: 324, 0xC00000B7: 47, 0x40000028: 352}

_KEYS = "keys"
# per architecture (AUDIT_ARCH_*): {syscall number: index of its mode argument, or _KEYS for
# add_key, request_key and keyctl (refused whatever their arguments)}
_ABIS: dict[str, dict[int, dict[int, int | str]]] = {
    "x86_64": {
        0xC000003E: {  # x86_64 (and x32, same numbers)
            **{90: 1, 91: 1, 268: 2, 452: 2},
            **dict.fromkeys((248, 249, 250), _KEYS),
        },
        0x40000003: {15: 1, 94: 1, 306: 2, 452: 2, **dict.fromkeys((286, 287, 288), _KEYS)},
    },
    "aarch64": {
        0xC00000B7: {  # aarch64 (fchmod, fchmodat, fchmodat2; the key calls)
            **{52: 1, 53: 2, 452: 2},
            **dict.fromkeys((217, 218, 219), _KEYS),
        },
        0x40000028: {15: 1, 94: 1, 333: 2, 452: 2, **dict.fromkeys((309, 310, 311), _KEYS)},
    },
}


def program(machine: str | None = None) -> bytes | None:
    """The filter as bwrap's ``--seccomp`` reads it (struct sock_filter[]), for ``machine``
    (default: this one); None where it is not known."""
    abis = _ABIS.get(machine or platform.machine())
    if abis is None:
        return None
    code: list[tuple[int, str | int, str | int, int]] = []  # (op, true, false, k) with labels
    labels: dict[str, int] = {}
    for i, (arch, calls) in enumerate(abis.items()):
        labels[f"abi{i}"] = len(code)
        code.append((_LD_ABS, 0, 0, _ARCH))
        code.append((_JEQ, 0, f"abi{i + 1}", arch))
        code.append((_LD_ABS, 0, 0, _NR))
        code.append((_AND, 0, 0, 0xFFFFFFFF & ~_X32_BIT))
        for nr, arg in calls.items():
            code.append((_JEQ, "deny" if arg == _KEYS else f"arg{arg}", 0, nr))
        code.append((_JEQ, "fallocate", 0, _FALLOCATE[arch]))
        code.append((_RET, 0, 0, _ALLOW))
    labels[f"abi{len(abis)}"] = len(code)
    code.append((_RET, 0, 0, _ALLOW))
    for arg in (1, 2):
        labels[f"arg{arg}"] = len(code)
        code.append((_LD_ABS, 0, 0, 16 + 8 * arg))
        code.append((_JSET, "deny", 0, _SETID))
        code.append((_RET, 0, 0, _ALLOW))
    labels["fallocate"] = len(code)
    code.append((_LD_ABS, 0, 0, 16 + 8 * 1))
    code.append((_JSET, 0, "no-fallocate", _PUNCH_HOLE))
    code.append((_RET, 0, 0, _ALLOW))
    labels["no-fallocate"] = len(code)
    code.append((_RET, 0, 0, _NO_FALLOCATE))
    labels["deny"] = len(code)
    code.append((_RET, 0, 0, _DENY))

    def jump(at: int, target: str | int) -> int:
        return target if isinstance(target, int) else labels[target] - at - 1

    return b"".join(
        struct.pack("=HBBI", op, jump(at, jt), jump(at, jf), k)
        for at, (op, jt, jf, k) in enumerate(code)
    )
