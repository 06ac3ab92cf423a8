"""A bridge's policy file: which mutations and commands it allows, denies or asks about.

::

    # quill attach ~/dev/app --as app --policy policy.toml
    default = "ask"                  # when no rule matches: ask (the default), allow or deny

    [[rule]]                         # rules are tried in order; the first that matches decides
    decision = "allow"
    ops = ["write", "edit", "modify", "mkdir"]
    paths = ["notes/**", "*.md"]     # every path the request names must match one of these

    [[rule]]
    decision = "deny"
    ops = ["delete", "move"]

    [[rule]]
    decision = "allow"
    ops = ["run"]
    commands = ['pytest( -q)?', 'ls( -l)?']   # regular expressions matching the whole command

``ops`` names ``write``, ``edit``, ``modify``, ``mkdir``, ``move``, ``delete``, ``apply``, ``run``
(``exec.run``) and ``git`` (a git action that changes files: ``commit``, ``checkout``); a rule
without ``ops`` applies to every op. ``paths`` are globs as everywhere in Quill (``**`` across
directories; a pattern without ``/`` matches a name at any depth); a rule with ``paths`` never
matches ``run`` or ``git``, whose commands may touch any path. A rule with ``commands`` matches
only ``run``. Reads are never asked about, so they have no rules.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import msgspec

from contracts.errors import QuillError
from core.globs import Globs

Verdict = Literal["allow", "deny", "ask"]
OPS = frozenset({"write", "edit", "modify", "mkdir", "move", "delete", "apply", "run", "git"})


class RuleSpec(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    decision: Verdict
    ops: list[str] | None = None
    paths: list[str] | None = None
    commands: list[str] | None = None


class PolicySpec(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    default: Verdict = "ask"
    rule: list[RuleSpec] = msgspec.field(default_factory=list)


@dataclass(frozen=True)
class Request:
    """What a request asks to do, as a policy (and a person) sees it."""

    op: str
    paths: list[str]
    """Normalised workspace paths it names (none for ``run`` and ``git``)."""
    command: str | None = None


@dataclass(frozen=True)
class Rule:
    decision: Verdict
    ops: frozenset[str] | None
    paths: Globs | None
    commands: tuple[re.Pattern[str], ...] | None

    def matches(self, request: Request) -> bool:
        if self.ops is not None and request.op not in self.ops:
            return False
        if self.paths is not None:
            paths = self.paths
            if not request.paths or not all(paths.match(p) for p in request.paths):
                return False
        if self.commands is not None:
            command = request.command
            if command is None or not any(c.fullmatch(command) for c in self.commands):
                return False
        return True


@dataclass(frozen=True)
class Policy:
    default: Verdict = "ask"
    rules: tuple[Rule, ...] = ()

    def decide(self, request: Request) -> Verdict:
        """The first matching rule's decision, else the default."""
        for rule in self.rules:
            if rule.matches(request):
                return rule.decision
        return self.default

    @classmethod
    def load(cls, path: Path) -> Policy:
        """Read a policy file.

        Raises:
            ValueError: it cannot be read, or says something this module does not know.
        """
        try:
            raw = tomllib.loads(path.read_text("utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ValueError(f"cannot read the policy file {path}: {exc}") from None
        return cls.parse(raw, str(path))

    @classmethod
    def parse(cls, raw: object, source: str = "policy") -> Policy:
        """A policy from its TOML document (as parsed).

        Raises:
            ValueError: an unknown key, op or decision, a bad glob or regular expression.
        """
        try:
            spec = msgspec.convert(raw, PolicySpec)
        except msgspec.ValidationError as exc:
            raise ValueError(f"{source}: {exc}") from None
        rules = []
        for i, item in enumerate(spec.rule, 1):
            where = f"{source}: rule {i}"
            unknown = sorted(set(item.ops or ()) - OPS)
            if unknown:
                raise ValueError(f"{where}: unknown op {unknown[0]!r} ({', '.join(sorted(OPS))})")
            try:
                paths = Globs.names(item.paths) if item.paths is not None else None
                commands = (
                    tuple(re.compile(c) for c in item.commands)
                    if item.commands is not None
                    else None
                )
            except QuillError as exc:
                raise ValueError(f"{where}: {exc.message}") from None
            except re.error as exc:
                raise ValueError(f"{where}: bad command pattern: {exc}") from None
            ops = frozenset(item.ops) if item.ops is not None else None
            if paths is not None:
                ops = (ops if ops is not None else OPS) - {"run", "git"}
            if commands is not None:
                ops = (ops if ops is not None else OPS) & {"run"}
            rules.append(Rule(item.decision, ops, paths, commands))
        return cls(spec.default, tuple(rules))
