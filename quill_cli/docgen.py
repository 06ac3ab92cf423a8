"""Generate the contract's documents from ``contracts``: JSON Schemas, AsyncAPI, op reference.

Why one module of ~450 lines: its generators (schemas, AsyncAPI, contract.md, cli.md) share
the attribute docstrings and the op table, and ``--check`` compares all of them at once.

``python -m quill_cli.docgen`` writes ``docs/schemas/*.json``, ``docs/asyncapi.yaml``, the
table of exit statuses in ``docs/cli.md`` and the generated part of ``docs/contract.md``
(between their ``BEGIN``/``END GENERATED`` markers);
``--check`` fails if any of them differs from what the code says (CI runs it).
Field descriptions come from the attribute docstrings and ``Meta(description=…)`` of the
Structs; example replies come from ``docs/examples.json`` (recorded by
``python -m quill_cli.docgen --record-examples``, verified by ``tests/system/test_docs.py``).
"""

from __future__ import annotations

import argparse
import ast
import inspect
import json
import sys
from pathlib import Path
from typing import Any

import msgspec

from contracts import errors, events, limits, ops, replies, requests
from contracts.ops import OpSpec
from contracts.subjects import HEADER_ACTOR, HEADER_REQUEST_ID, HEADER_RUN, HEADER_SESSION

DOCS = Path(__file__).resolve().parent.parent / "docs"
BEGIN, END = "<!-- BEGIN GENERATED OPS -->", "<!-- END GENERATED OPS -->"
EXIT_BEGIN = "<!-- BEGIN GENERATED EXIT CODES -->"
EXIT_END = "<!-- END GENERATED EXIT CODES -->"
MODULES = (requests, replies, events, limits)


def attribute_docs() -> dict[str, dict[str, str]]:
    """``{class name: {field: docstring}}`` from the docstring under each field."""
    out: dict[str, dict[str, str]] = {}
    for module in MODULES:
        tree = ast.parse(inspect.getsource(module))
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            docs = out.setdefault(node.name, {})
            body = node.body
            for first, second in zip(body, body[1:], strict=False):
                if (
                    isinstance(first, ast.AnnAssign)
                    and isinstance(first.target, ast.Name)
                    and isinstance(second, ast.Expr)
                    and isinstance(second.value, ast.Constant)
                    and isinstance(second.value.value, str)
                ):
                    docs[first.target.id] = " ".join(second.value.value.split())
    return out


def _describe(schema: dict[str, Any], docs: dict[str, dict[str, str]]) -> dict[str, Any]:
    """Add field descriptions (and inherited ones) to every component of ``schema``."""
    for name, component in schema.get("$defs", {}).items():
        cls = _find_class(name)
        mro = [c.__name__ for c in cls.__mro__] if cls else [name.split("[")[0]]
        for field, prop in component.get("properties", {}).items():
            for owner in mro:
                text = docs.get(owner, {}).get(field)
                if text and "description" not in prop:
                    prop["description"] = text
                    break
    return schema


def _find_class(name: str) -> type | None:
    base = name.split("[")[0]
    for module in MODULES:
        cls = getattr(module, base, None)
        if isinstance(cls, type):
            return cls
    return None


def schema_of(tp: Any, docs: dict[str, dict[str, str]]) -> dict[str, Any]:
    schema = msgspec.json.schema(tp)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return _describe(schema, docs)


def reply_type(spec: OpSpec) -> Any:
    return replies.Reply[spec.result]  # type: ignore[name-defined]


def schemas(docs: dict[str, dict[str, str]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for spec in ops.OPS.values():
        out[f"{spec.key}.request.json"] = schema_of(spec.request, docs)
        out[f"{spec.key}.reply.json"] = schema_of(reply_type(spec), docs)
    out["event.json"] = schema_of(events.WorkspaceEvent, docs)
    out["workspace_updated.json"] = schema_of(events.WorkspaceUpdated, docs)
    out["audit_record.json"] = schema_of(events.AuditRecord, docs)
    return out


# ---------------------------------------------------------------- AsyncAPI


def asyncapi(docs: dict[str, dict[str, str]]) -> dict[str, Any]:
    params = {
        "tenant": {"description": "Tenant id: [a-z0-9][a-z0-9_-]{0,63}"},
        "workspace": {"description": "Workspace id: [a-z0-9][a-z0-9_-]{0,63}"},
    }
    headers = {
        "type": "object",
        "properties": {
            HEADER_REQUEST_ID: {"type": "string", "description": "Idempotency key (commands)."},
            HEADER_ACTOR: {"type": "string", "description": "Who asks (recorded in events)."},
            HEADER_SESSION: {"type": "string", "description": "Session of the asker."},
            HEADER_RUN: {"type": "string", "description": "Run of the asker."},
        },
    }
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    messages: dict[str, Any] = {}
    components: dict[str, Any] = {}

    def add_schema(name: str, tp: Any) -> dict[str, str]:
        schema = schema_of(tp, docs)
        for key, value in schema.pop("$defs", {}).items():
            components[key] = value
        schema.pop("$schema", None)
        text = json.dumps(schema).replace("#/$defs/", "#/components/schemas/")
        components[name] = json.loads(text)
        return {"$ref": f"#/components/schemas/{name}"}

    for spec in ops.OPS.values():
        key = spec.key.replace(".", "_")
        messages[f"{key}_request"] = {
            "name": f"{spec.key}.request",
            "title": f"{spec.key} request",
            "summary": spec.summary,
            "headers": headers,
            "payload": add_schema(f"{key}_request", spec.request),
        }
        messages[f"{key}_reply"] = {
            "name": f"{spec.key}.reply",
            "title": f"{spec.key} reply",
            "payload": add_schema(f"{key}_reply", reply_type(spec)),
        }
        channels[key] = {
            "address": f"ws.{spec.kind}.{{tenant}}.{{workspace}}.{spec.name}",
            "description": spec.summary,
            "parameters": params,
            "messages": {"request": {"$ref": f"#/components/messages/{key}_request"}},
        }
        channels[f"{key}_reply"] = {
            "address": None,
            "description": "The requester's inbox (the NATS reply subject).",
            "messages": {"reply": {"$ref": f"#/components/messages/{key}_reply"}},
        }
        service = {"cmd": "writer", "qry": "readers", "exec": "executors"}[spec.kind]
        operations[key] = {
            "action": "receive",
            "title": f"{spec.key} ({service})",
            "summary": spec.summary,
            "channel": {"$ref": f"#/channels/{key}"},
            "reply": {"channel": {"$ref": f"#/channels/{key}_reply"}},
        }
    for name, address, tp, summary in (
        (
            "events",
            "ws.evt.{tenant}.{workspace}",
            events.WorkspaceEvent,
            "The workspace's log (stream WS_EVENTS); published by writers only.",
        ),
        (
            "updated",
            "ws.updated.{tenant}.{workspace}",
            events.WorkspaceUpdated,
            "workspace.updated: one message per committed change.",
        ),
        (
            "audit",
            "ws.audit.{tenant}.{workspace}",
            events.AuditRecord,
            "One audit record per operation (stream WS_AUDIT).",
        ),
    ):
        messages[name] = {"name": name, "summary": summary, "payload": add_schema(name, tp)}
        channels[name] = {
            "address": address,
            "description": summary,
            "parameters": params,
            "messages": {name: {"$ref": f"#/components/messages/{name}"}},
        }
        operations[f"{name}_publish"] = {
            "action": "send",
            "summary": summary,
            "channel": {"$ref": f"#/channels/{name}"},
        }
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "Quill",
            "version": "0.1.0",
            "description": "Event-sourced workspaces for agents, on NATS. Requests and replies "
            "are JSON; replies are {ok, version, result} or {ok: false, error}. See "
            "docs/contract.md.",
        },
        "defaultContentType": "application/json",
        "servers": {"local": {"host": "127.0.0.1:4222", "protocol": "nats"}},
        "channels": channels,
        "operations": operations,
        "components": {"messages": messages, "schemas": components},
    }


# ---------------------------------------------------------------- contract.md


def _type_text(t: msgspec.inspect.Type) -> str:
    """A type as shown in the tables (`or` rather than `|`, which would split a cell)."""
    mi = msgspec.inspect
    if isinstance(t, mi.Metadata):
        return _type_text(t.type)
    if isinstance(t, mi.UnionType):
        parts = [_type_text(x) for x in t.types if not isinstance(x, mi.NoneType)]
        text = " or ".join(parts)
        return text + (" or null" if t.includes_none else "")
    if isinstance(t, mi.LiteralType):
        return " or ".join(json.dumps(v) for v in t.values)
    if isinstance(t, mi.ListType):
        return f"list[{_type_text(t.item_type)}]"
    if isinstance(t, mi.DictType):
        return f"object[{_type_text(t.value_type)}]"
    if isinstance(t, mi.StructType):
        return t.cls.__name__
    simple = {
        mi.StrType: "string",
        mi.IntType: "integer",
        mi.BoolType: "boolean",
        mi.FloatType: "number",
        mi.BytesType: "bytes (base64)",
        mi.DateTimeType: "RFC 3339 time",
        mi.NoneType: "null",
        mi.AnyType: "any",
        mi.RawType: "JSON",
    }
    return simple.get(type(t), type(t).__name__.removesuffix("Type").lower())


def _fields_table(cls: type, docs: dict[str, dict[str, str]]) -> list[str]:
    info = msgspec.inspect.type_info(cls)
    assert isinstance(info, msgspec.inspect.StructType)
    if not info.fields:
        return ["(no fields)"]
    rows = ["| field | type | default | description |", "|---|---|---|---|"]
    owners = [c.__name__ for c in cls.__mro__]
    for field in info.fields:
        default = (
            "required"
            if field.required
            else json.dumps(
                msgspec.to_builtins(field.default)
                if field.default is not msgspec.NODEFAULT
                else None
            )
        )
        text = next((docs[o][field.name] for o in owners if field.name in docs.get(o, {})), "")
        if not text:
            text = _meta_description(field.type)
        text = text.replace("``", "`").replace("|", "\\|")
        rows.append(f"| `{field.name}` | {_type_text(field.type)} | {default} | {text} |")
    return rows


def _meta_description(t: msgspec.inspect.Type) -> str:
    mi = msgspec.inspect
    if isinstance(t, mi.UnionType):
        return next((d for x in t.types if (d := _meta_description(x))), "")
    if isinstance(t, mi.Metadata):
        return str((t.extra_json_schema or {}).get("description", ""))
    return ""


def contract_ops(docs: dict[str, dict[str, str]], examples: dict[str, Any]) -> str:
    lines: list[str] = []
    titles = {
        "cmd": "Commands (to the writer)",
        "qry": "Queries (to the readers)",
        "exec": "Executions (to the executors; docs/executor.md)",
    }
    for kind in ("cmd", "qry", "exec"):
        lines += [f"### {titles[kind]}", ""]
        for spec in ops.of_kind(kind):
            lines += [
                f"#### `{spec.key}`",
                "",
                spec.summary,
                "",
                f"Subject: `ws.{kind}.<tenant>.<workspace>.{spec.name}`",
                "",
                f"Request (`{spec.request.__name__}`, schema "
                f"[`schemas/{spec.key}.request.json`](schemas/{spec.key}.request.json)):",
                "",
                *_fields_table(spec.request, docs),
                "",
                f"Result (`{spec.result.__name__}`, schema "
                f"[`schemas/{spec.key}.reply.json`](schemas/{spec.key}.reply.json)):",
                "",
                *_fields_table(spec.result, docs),
                "",
                "Errors: " + ", ".join(f"`{e}`" for e in spec.errors) + ".",
                "",
            ]
            example = examples.get(spec.key)
            if example:
                lines += [
                    "Example (workspace `acme/demo`):",
                    "",
                    "```json",
                    "// request",
                    json.dumps(example["request"]),
                    "// reply",
                    json.dumps(example["reply"], indent=2),
                    "```",
                    "",
                ]
    lines += ["### Nested types", ""]
    for cls in (
        requests.PutChange,
        requests.DeleteChange,
        requests.MkdirChange,
        requests.ReplaceLines,
        requests.InsertLines,
        requests.DeleteLines,
        requests.RegexReplace,
        limits.LimitsPatch,
        limits.Limits,
        replies.Entry,
        replies.GrepMatch,
        replies.TreeEntry,
        replies.FileDiff,
        replies.Revision,
        replies.ChangeConflict,
        replies.ChangeSummary,
        replies.EventSummary,
    ):
        lines += [
            f"#### `{cls.__name__}`",
            "",
            (cls.__doc__ or "").strip(),
            "",
            *_fields_table(cls, docs),
            "",
        ]
    lines += ["### Error codes", "", "| code | meaning |", "|---|---|"]
    source = inspect.getsource(errors.ErrorCode)
    code_docs = attribute_docs_of(source)
    for code in errors.ErrorCode:
        meaning = code_docs.get(code.name, "").replace("``", "`")
        lines.append(f"| `{code}` | {meaning} |")
    return "\n".join(lines) + "\n"


def attribute_docs_of(source: str) -> dict[str, str]:
    tree = ast.parse(source)
    out: dict[str, str] = {}
    body = tree.body[0].body if isinstance(tree.body[0], ast.ClassDef) else []
    for first, second in zip(body, body[1:], strict=False):
        if isinstance(first, ast.Assign) and isinstance(second, ast.Expr):
            target = first.targets[0]
            if isinstance(target, ast.Name) and isinstance(second.value, ast.Constant):
                out[target.id] = " ".join(str(second.value.value).split())
    return out


def exit_codes() -> str:
    """docs/cli.md's table of the exit status of every error code (``EXIT_CODES``)."""
    from quill_cli.common import EXIT_CODES

    code_docs = attribute_docs_of(inspect.getsource(errors.ErrorCode))
    rows = sorted(errors.ErrorCode, key=lambda c: (EXIT_CODES.get(c, 1), str(c)))
    lines = ["| code | exit status | meaning |", "|---|---|---|"]
    for code in rows:
        meaning = code_docs.get(code.name, "").replace("``", "`").replace("|", "\\|")
        lines.append(f"| `{code}` | {EXIT_CODES.get(code, 1)} | {meaning} |")
    return "\n".join(lines) + "\n"


def _between(text: str, begin: str, end: str, content: str) -> str:
    head, _, rest = text.partition(begin)
    _, _, tail = rest.partition(end)
    return f"{head}{begin}\n\n{content}\n{end}{tail}"


# ---------------------------------------------------------------- main


def generated() -> dict[Path, str]:
    """Every generated file and its content."""
    import yaml

    docs = attribute_docs()
    examples_path = DOCS / "examples.json"
    examples = json.loads(examples_path.read_text()) if examples_path.exists() else {}
    files = {
        DOCS / "schemas" / name: json.dumps(schema, indent=2, sort_keys=True) + "\n"
        for name, schema in schemas(docs).items()
    }
    files[DOCS / "asyncapi.yaml"] = yaml.safe_dump(asyncapi(docs), sort_keys=False, width=100)
    contract = (DOCS / "contract.md").read_text()
    files[DOCS / "contract.md"] = _between(contract, BEGIN, END, contract_ops(docs, examples))
    cli = (DOCS / "cli.md").read_text()
    files[DOCS / "cli.md"] = _between(cli, EXIT_BEGIN, EXIT_END, exit_codes())
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m quill_cli.docgen")
    parser.add_argument("--check", action="store_true", help="Fail if a document is stale.")
    parser.add_argument(
        "--record-examples",
        action="store_true",
        help="Run the examples against a fresh stack into docs/examples.json.",
    )
    args = parser.parse_args(argv)
    if args.record_examples:
        import asyncio

        from quill_cli.examples import record

        asyncio.run(record(DOCS / "examples.json"))
    stale = []
    for path, content in generated().items():
        if path.exists() and path.read_text() == content:
            continue
        stale.append(path)
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)
    if args.check and stale:
        names = ", ".join(str(p.relative_to(DOCS.parent)) for p in stale)
        print(f"stale generated docs: {names}; run python -m quill_cli.docgen", file=sys.stderr)
        return 1
    print(f"{'checked' if args.check else 'wrote'} {len(generated())} generated documents")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
