"""A client's regular expression, run in linear time where RE2 can say the same thing.

grep's pattern and ``modify``'s ``regex_replace`` are Python ``re`` syntax, and the ``regex``
module (``V0``: ``re``'s behaviour) is the engine of record. A backtracking engine can take
exponential time on a short pattern (``(a|aa)+$`` over forty ``a`` and a ``!``), so a pattern is
first translated into RE2 syntax, and RE2 (``google-re2``, a linear-time automaton) runs it when
the translation exists:

* the pattern's parse tree comes from the standard library's own parser (``re._parser``), so
  what each node means is not re-derived from the text; a pattern that parser refuses, or warns
  about (``[[:alpha:]]`` means something else to ``regex``), is not translated;
* ``\\d``, ``\\w``, ``\\s`` and their negations become explicit code point ranges, taken from the
  ``regex`` module itself (so both engines agree on them, whatever Unicode version each ships);
* ``^``/``$``/``\\A``/``\\Z`` keep their meaning (``$`` without ``MULTILINE``, which ``re`` also
  lets match before a final newline, is not translated); ``\\b``/``\\B`` are ASCII in RE2, so a
  pattern using them runs on RE2 only over an ASCII text (``ascii_only``);
* backreferences, lookaround, atomic groups and possessive repeats have no RE2 form: such a
  pattern runs on ``regex`` with a time budget (its ``timeout=``), in a worker that can be
  stopped (``infra/offload.py``), so it costs its own tenant only.

RE2 runs over UTF-8 bytes (positions are byte offsets; matches fall on character boundaries);
``regex`` over the decoded text. ``Subject`` hides which: it is one text bound to the engine
that runs the pattern over it.
"""

from __future__ import annotations

import array
import functools
import itertools
import re._constants as sre
import re._parser as sre_parse  # the stdlib's own regex parser
import sys
import warnings
from collections.abc import Callable
from typing import Any

import re2
import regex

from contracts.errors import ErrorCode, QuillError

Spans = list[tuple[int, int]]
"""Where a match and each of its groups are (``(-1, -1)``: a group that did not take part)."""

_REGEX_FLAGS = {"i": regex.IGNORECASE, "m": regex.MULTILINE, "s": regex.DOTALL, "x": regex.VERBOSE}
_PARSER_FLAGS = {
    "i": sre.SRE_FLAG_IGNORECASE,
    "m": sre.SRE_FLAG_MULTILINE,
    "s": sre.SRE_FLAG_DOTALL,
    "x": sre.SRE_FLAG_VERBOSE,
}

RE2_MAX_MEM = 64 * 1024 * 1024
"""Memory one compiled RE2 pattern may use (its program and DFA caches; past it RE2 runs
slower but still in linear time, or refuses the pattern, which then runs on ``regex``)."""

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False
_OPTIONS.max_mem = RE2_MAX_MEM
_UNANCHORED = re2._re2.RE2.Anchor.UNANCHORED
_NULL = (-1, -1)


class Untranslatable(Exception):
    """The pattern has no RE2 form with the same meaning."""


class UserPattern:
    """A client's pattern, compiled: by RE2 when it can say the same, always by ``regex``
    (its errors are the ones a client is shown, and it runs what RE2 cannot)."""

    def __init__(self, pattern: str, flags: str = "", *, literal: bool = False) -> None:
        """``flags``: letters of ``i`` (ignore case), ``m`` (multiline), ``s`` (dot matches
        newline), ``x`` (verbose); ``literal``: ``pattern`` is plain text.

        Raises:
            QuillError: ``INVALID_ARGUMENT`` naming the problem for an invalid pattern.
        """
        self.pattern = pattern
        source = regex.escape(pattern) if literal else pattern
        bits = 0
        for letter in flags:
            bits |= _REGEX_FLAGS[letter]
        try:
            self.fallback: Any = regex.compile(source, bits | regex.V0)
        except (regex.error, OverflowError, RecursionError) as exc:
            raise QuillError(
                ErrorCode.INVALID_ARGUMENT,
                f"Invalid regex {pattern!r}: {exc}",
                {"pattern": pattern},
            ) from None
        self.linear: Any = None
        """The RE2 form (its ``_re2.RE2``), or None."""
        self.ascii_only = False
        """RE2 means the same over an ASCII text only (the pattern has ``\\b``/``\\B``)."""
        self.may_be_empty = True
        """A match may be empty (then a global replacement's next match, which ``re`` lets
        be a non-empty one at the same place, is one RE2 cannot ask for)."""
        try:
            translated, self.ascii_only, self.may_be_empty = translate(source, flags)
            compiled = re2.compile(translated, _OPTIONS)
        except (Untranslatable, re2.error):
            return
        if compiled.groups == self.fallback.groups:
            self.linear = compiled._regexp

    def over(self, text: str | bytes, *, global_replace: bool = False) -> Subject:
        """``text`` (UTF-8 bytes, or a str) bound to the engine that runs this pattern on it
        (``global_replace``: for a replacement of every match)."""
        linear = self.linear is not None and not (global_replace and self.may_be_empty)
        if linear:
            data = text.encode() if isinstance(text, str) else text
            if not self.ascii_only or data.isascii():
                return _Linear(self.linear, data)
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        return _Backtracking(self.fallback, text)

    @property
    def groupindex(self) -> dict[str, int]:
        return dict(self.fallback.groupindex)


class Subject:
    """One text and the engine running one pattern over it. ``text`` is what positions index
    (UTF-8 bytes for RE2, str for ``regex``); ``newline`` is ``\\n`` of the same type."""

    text: Any
    newline: Any

    def search(self, pos: int, timeout: float) -> Spans | None:
        """The first match at or after ``pos``, or None.

        Raises:
            TimeoutError: a backtracking search took longer than ``timeout`` seconds.
        """
        raise NotImplementedError

    def part(self, start: int, end: int) -> Subject:
        """``text[start:end]`` on its own (``^``, ``$`` and the rest at its edges)."""
        raise NotImplementedError

    def count(self, lines: list[Any], timeout: float) -> int:
        """How many of ``lines`` (parts of ``text``) the pattern matches in.

        Raises:
            TimeoutError: a backtracking search took longer than ``timeout`` seconds.
        """
        raise NotImplementedError

    def sub(
        self, replace: Callable[[Spans], str], every: bool, remaining: Callable[[], float]
    ) -> tuple[str, int]:
        """The text with its first match (each, with ``every``) replaced by ``replace(spans)``,
        as ``re.subn`` does, and how many.

        Raises:
            TimeoutError: it took longer than ``remaining()`` seconds.
        """
        raise NotImplementedError

    def decode(self, part: Any) -> str:
        """A slice of ``text`` as a str."""
        raise NotImplementedError

    def encode(self, part: str) -> Any:
        """A str as a slice of ``text`` would be."""
        raise NotImplementedError


class _Linear(Subject):
    __slots__ = ("text", "newline", "_compiled", "_match")

    def __init__(self, compiled: Any, data: bytes) -> None:
        self.text, self.newline, self._compiled = data, b"\n", compiled
        self._match: Callable[..., Spans] = functools.partial(compiled.Match, _UNANCHORED)

    def search(self, pos: int, timeout: float) -> Spans | None:
        spans = self._match(self.text, pos, len(self.text))
        return None if spans[0] == _NULL else spans

    def part(self, start: int, end: int) -> Subject:
        return _Linear(self._compiled, self.text[start:end])

    def count(self, lines: list[Any], timeout: float) -> int:
        found = map(self._match, lines, itertools.repeat(0), map(len, lines))
        return sum(1 for spans in found if spans[0] != _NULL)

    def sub(
        self, replace: Callable[[Spans], str], every: bool, remaining: Callable[[], float]
    ) -> tuple[str, int]:
        # Only asked when no match is empty, or for the first one (``UserPattern.over``): so
        # the next match starts where one ends, as in ``re.subn``.
        text = self.text
        parts: list[bytes] = []
        pos = count = 0
        while (spans := self.search(pos, 0)) is not None:
            start, end = spans[0]
            parts += [text[pos:start], replace(spans).encode()]
            pos, count = end, count + 1
            if not every or end == start:
                break
        parts.append(text[pos:])
        return b"".join(parts).decode(), count

    def decode(self, part: Any) -> str:
        return bytes(part).decode()

    def encode(self, part: str) -> Any:
        return part.encode()


class _Backtracking(Subject):
    __slots__ = ("text", "newline", "_compiled")

    def __init__(self, compiled: Any, text: str) -> None:
        self.text, self.newline, self._compiled = text, "\n", compiled

    def search(self, pos: int, timeout: float) -> Spans | None:
        if timeout <= 0:
            raise TimeoutError
        found = self._compiled.search(self.text, pos, timeout=timeout)
        if found is None:
            return None
        return [found.span(i) for i in range(self._compiled.groups + 1)]

    def part(self, start: int, end: int) -> Subject:
        return _Backtracking(self._compiled, self.text[start:end])

    def count(self, lines: list[Any], timeout: float) -> int:
        if timeout <= 0:
            raise TimeoutError
        search = functools.partial(self._compiled.search, timeout=timeout)
        return sum(map(bool, map(search, lines)))

    def sub(
        self, replace: Callable[[Spans], str], every: bool, remaining: Callable[[], float]
    ) -> tuple[str, int]:
        groups = range(self._compiled.groups + 1)
        timeout = remaining()
        if timeout <= 0:
            raise TimeoutError
        out, count = self._compiled.subn(
            lambda found: replace([found.span(i) for i in groups]),
            self.text,
            count=0 if every else 1,
            timeout=timeout,
        )
        return str(out), int(count)

    def decode(self, part: Any) -> str:
        return str(part)

    def encode(self, part: str) -> Any:
        return part


# ---------------------------------------------------------------- the translation


def translate(pattern: str, flags: str = "") -> tuple[str, bool, bool]:
    """``pattern`` (Python syntax, with the flag letters ``flags``) in RE2 syntax; whether
    RE2 agrees with ``regex`` on ASCII texts only (the pattern uses ``\\b``/``\\B``); whether
    a match may be empty.

    Raises:
        Untranslatable: the pattern has no RE2 form with the same meaning.
    """
    bits = 0
    for letter in flags:
        bits |= _PARSER_FLAGS[letter]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a FutureWarning: regex reads it otherwise
            parsed = sre_parse.parse(pattern, bits)
    except Exception:
        raise Untranslatable(pattern) from None
    every = parsed.state.flags
    if every & sre.SRE_FLAG_ASCII and _ignores_case(every, list(parsed)):
        raise Untranslatable("ASCII-only case folding")  # RE2 folds Unicode
    state = _State(parsed.state.groupdict)
    out = state.sequence(list(parsed), every)
    case = "(?i)" if every & sre.SRE_FLAG_IGNORECASE else ""
    return case + out, state.word_boundary, parsed.getwidth()[0] == 0


def _ignores_case(flags: int, items: list[Any]) -> bool:
    """Whether any part of the pattern ignores case."""
    return bool(flags & sre.SRE_FLAG_IGNORECASE) or any(
        op is sre.SUBPATTERN and av[1] & sre.SRE_FLAG_IGNORECASE for op, av in _walk(items)
    )


def _walk(items: list[Any]) -> Any:
    for op, av in items:
        yield op, av
        if op is sre.SUBPATTERN:
            yield from _walk(list(av[3]))
        elif op in (sre.MAX_REPEAT, sre.MIN_REPEAT):
            yield from _walk(list(av[2]))
        elif op is sre.BRANCH:
            for branch in av[1]:
                yield from _walk(list(branch))


class _State:
    """What translating one pattern gathers: group names, and whether it uses ``\\b``."""

    def __init__(self, groupdict: dict[str, int]) -> None:
        self.names = {number: name for name, number in groupdict.items()}
        self.word_boundary = False

    def sequence(self, items: list[Any], flags: int) -> str:
        return "".join(self.node(op, av, flags) for op, av in items)

    def node(self, op: Any, av: Any, flags: int) -> str:
        if op is sre.LITERAL:
            return _char(av)
        if op is sre.NOT_LITERAL:
            return f"[^{_char(av)}]"
        if op is sre.ANY:
            return "(?s:.)" if flags & sre.SRE_FLAG_DOTALL else "(?-s:.)"
        if op is sre.IN:
            return _charset(av, flags)
        if op is sre.CATEGORY:
            return _charset([(op, av)], flags)
        if op is sre.BRANCH:
            return "(?:" + "|".join(self.sequence(list(b), flags) for b in av[1]) + ")"
        if op is sre.SUBPATTERN:
            return self._group(av, flags)
        if op in (sre.MAX_REPEAT, sre.MIN_REPEAT):
            low, high, item = av
            body = self.sequence(list(item), flags)
            if high is sre.MAXREPEAT:
                count = "*" if low == 0 else "+" if low == 1 else f"{{{low},}}"
            else:
                count = "?" if (low, high) == (0, 1) else f"{{{low},{high}}}"
            return f"(?:{body}){count}" + ("?" if op is sre.MIN_REPEAT else "")
        if op is sre.AT:
            return self._at(av, flags)
        raise Untranslatable(str(op))  # backreferences, lookaround, atomic, possessive...

    def _group(self, av: Any, flags: int) -> str:
        """A group; its flags (``(?i:...)``...). Dot and anchors are translated by the flags
        in force where they are, so only ignoring case is left for RE2 to know."""
        group, add, remove, item = av
        inner = (flags | add) & ~remove
        if (add | remove) & (sre.SRE_FLAG_LOCALE | sre.SRE_FLAG_UNICODE | sre.SRE_FLAG_ASCII):
            raise Untranslatable("scoped locale, unicode or ascii flags")
        body = self.sequence(list(item), inner)
        case = sre.SRE_FLAG_IGNORECASE
        if (inner & case) != (flags & case):
            body = f"(?{'i' if inner & case else '-i'}:{body})"
        if group is None:
            return f"(?:{body})"
        name = self.names.get(group)
        if name is not None and not (name.isascii() and name.isidentifier()):
            raise Untranslatable(f"group name {name!r}")
        return (f"(?P<{name}>" if name is not None else "(") + body + ")"

    def _at(self, where: Any, flags: int) -> str:
        multiline = flags & sre.SRE_FLAG_MULTILINE
        if where is sre.AT_BEGINNING:
            return "(?m:^)" if multiline else r"\A"
        if where is sre.AT_BEGINNING_STRING:
            return r"\A"
        if where is sre.AT_END_STRING:
            return r"\z"
        if where is sre.AT_END and multiline:
            return "(?m:$)"
        if where in (sre.AT_BOUNDARY, sre.AT_NON_BOUNDARY):
            if not flags & sre.SRE_FLAG_ASCII:
                self.word_boundary = True  # RE2's are ASCII: right on an ASCII text only
            return r"\b" if where is sre.AT_BOUNDARY else r"\B"
        raise Untranslatable(str(where))  # $ without MULTILINE also matches before a last \n


def _char(code: int) -> str:
    char = chr(code)
    return char if char.isascii() and (char.isalnum() or char == "_") else f"\\x{{{code:x}}}"


def literal(text: str) -> str:
    """``text`` as an RE2 expression matching exactly it."""
    return "".join(_char(ord(c)) for c in text)


def set_without(members: str, negate: bool, excluded: str) -> str:
    """The set ``[members]`` (Python syntax; ``[^members]`` with ``negate``) as an RE2
    expression that never matches a character of ``excluded``.

    Raises:
        Untranslatable: ``members`` is not a set's contents.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            parsed = list(sre_parse.parse(f"[{members}]"))
    except Exception:
        raise Untranslatable(members) from None
    if len(parsed) != 1 or parsed[0][0] not in (sre.IN, sre.LITERAL):
        raise Untranslatable(members)
    op, av = parsed[0]
    found: Ranges = [(av, av)] if op is sre.LITERAL else _members(av)
    out = [(ord(c), ord(c)) for c in excluded]
    ranges = _complement(found + out) if negate else _subtract(found, out)
    body = "".join(
        _char(lo) if lo == hi else f"{_char(lo)}-{_char(hi)}" for lo, hi in _valid(ranges)
    )
    return f"[{body}]" if body else NOTHING


# ---------------------------------------------------------------- character sets

Ranges = list[tuple[int, int]]
_TOP = 0x10FFFF
_SURROGATES = (0xD800, 0xDFFF)
_CATEGORIES = {
    sre.CATEGORY_DIGIT: (r"\d", False),
    sre.CATEGORY_NOT_DIGIT: (r"\d", True),
    sre.CATEGORY_WORD: (r"\w", False),
    sre.CATEGORY_NOT_WORD: (r"\w", True),
    sre.CATEGORY_SPACE: (r"\s", False),
    sre.CATEGORY_NOT_SPACE: (r"\s", True),
}


NOTHING = r"[^\x00-\x{10ffff}]"
"""An RE2 class no character is in."""


def _charset(items: list[Any], flags: int) -> str:
    """A character set (``[...]``, or one category) as an RE2 class of explicit ranges."""
    negate = bool(items) and items[0][0] is sre.NEGATE
    members = items[1:] if negate else items
    ascii_only = bool(flags & sre.SRE_FLAG_ASCII)
    complemented = any(
        op is sre.CATEGORY and _CATEGORIES[av][1]
        for op, av in members
        if op is sre.CATEGORY and av in _CATEGORIES
    )
    if complemented and flags & sre.SRE_FLAG_IGNORECASE:
        raise Untranslatable("a complemented set ignoring case")  # RE2 would fold it back
    body = "".join(
        _char(lo) if lo == hi else f"{_char(lo)}-{_char(hi)}"
        for lo, hi in _valid(_members(members, ascii_only))
    )
    if not body:
        return "(?s:.)" if negate else NOTHING
    return f"[{'^' if negate else ''}{body}]"


def _members(items: list[Any], ascii_only: bool = False) -> Ranges:
    """The code points a set's items name (without its ``NEGATE``)."""
    ranges: Ranges = []
    for op, av in items:
        if op is sre.LITERAL:
            ranges.append((av, av))
        elif op is sre.RANGE:
            ranges.append(av)
        elif op is sre.CATEGORY and av in _CATEGORIES:
            name, inverse = _CATEGORIES[av]
            found = _category(name, ascii_only)
            ranges += _complement(found) if inverse else found
        elif op is sre.NEGATE:
            raise Untranslatable("a negated set inside a set")
        else:
            raise Untranslatable(str(op))
    return ranges


def _merged(ranges: Ranges) -> Ranges:
    out: Ranges = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _complement(ranges: Ranges) -> Ranges:
    out: Ranges = []
    start = 0
    for lo, hi in _merged(ranges):
        if lo > start:
            out.append((start, lo - 1))
        start = hi + 1
    if start <= _TOP:
        out.append((start, _TOP))
    return out


def _subtract(ranges: Ranges, removed: Ranges) -> Ranges:
    out = _complement(_complement(ranges) + removed)
    return out


def _valid(ranges: Ranges) -> Ranges:
    """``ranges`` merged, without the surrogates (no UTF-8 text holds one)."""
    out: Ranges = []
    low, high = _SURROGATES
    for lo, hi in _merged(ranges):
        if hi < low or lo > high:
            out.append((lo, hi))
            continue
        if lo < low:
            out.append((lo, low - 1))
        if hi > high:
            out.append((high + 1, hi))
    return out


@functools.cache
def _category(name: str, ascii_only: bool) -> Ranges:
    """The code points ``regex`` (``V0``) puts in ``\\d``, ``\\w`` or ``\\s``, as ranges."""
    every = _every_char()
    flags = regex.V0 | (regex.ASCII if ascii_only else 0)
    out: Ranges = []
    for found in regex.finditer(name + "+", every, flags):
        start, end = found.span()
        first, last = ord(every[start]), ord(every[end - 1])
        if last - first == end - 1 - start:
            out.append((first, last))
        else:  # the run spans the surrogates left out of ``every``
            out += [(ord(c), ord(c)) for c in every[start:end]]
    return _merged(out)


@functools.cache
def _every_char() -> str:
    """Every code point but the surrogates, in order (built as UTF-32: 1.1 M characters)."""
    codes = array.array("I", range(0xD800))
    codes.extend(range(0xE000, _TOP + 1))
    return codes.tobytes().decode("utf-32-le" if sys.byteorder == "little" else "utf-32-be")
