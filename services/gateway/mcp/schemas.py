"""The output schemas MCP tools declare, and what keeps ``tools/list`` small.

A tool's ``outputSchema`` describes its ``structuredContent`` one level deep: each field with
its JSON type (objects and arrays by kind, not their insides: ``tools/list`` is read by every
client at every connection, and the full reply schemas are in ``docs/schemas/``). ``shape``
derives it from a contract type; ``obj`` writes one by hand (WAP's camelCase responses).

Errors are tool results too (``isError: true``) and carry WAP's error form
``{"error", "code", "details"}`` as ``structuredContent``. The MCP specification asks a tool
with an output schema for structured results that conform to it and does not exempt errors,
so every schema admits both: no field is required (a success and an error share none), and
``with_errors`` checks that no success field is named like an error field (whose type would
then constrain the error's). A client tells them apart by ``isError``. Naming each field once,
with its type, also keeps ``tools/list`` small.
"""

from __future__ import annotations

from typing import Any

import msgspec

Schema = dict[str, Any]

ERROR_FIELDS: Schema = {
    "error": {"type": "string"},
    "code": {"type": "string"},
    "details": {"type": "object"},
}
"""The error form's fields (``engine.error_data``): every output schema admits them."""
JSON_TYPES = ("string", "integer", "number", "boolean", "array", "object", "null")


def _types(node: Any) -> list[str]:
    """The JSON types a (msgspec) property schema admits."""
    if not isinstance(node, dict):
        return []
    if "$ref" in node:
        return ["object"]
    kind = node.get("type")
    if isinstance(kind, str):
        return [kind]
    if isinstance(kind, list):
        return [k for k in kind if isinstance(k, str)]
    options = node.get("anyOf") or node.get("oneOf")
    if isinstance(options, list):
        return [t for option in options for t in _types(option)]
    values = node.get("enum")
    if values is None and "const" in node:
        values = [node["const"]]
    if isinstance(values, list):
        names = {bool: "boolean", int: "integer", float: "number", str: "string"}
        return [names.get(type(v), "null" if v is None else "object") for v in values]
    return []


def typed(types: list[str]) -> Schema:
    """``{"type": ...}`` for ``types`` (deduplicated, in JSON Schema's order); ``{}`` for
    any."""
    unique = [t for t in JSON_TYPES if t in types]
    if not unique:
        return {}
    return {"type": unique[0] if len(unique) == 1 else unique}


def shape(kind: Any) -> Schema:
    """The one-level schema of a contract ``Struct`` as ``msgspec.to_builtins`` writes it."""
    schema = msgspec.json.schema(kind)
    defs = schema.get("$defs", {})
    root = schema
    if "$ref" in schema:
        root = defs[schema["$ref"].removeprefix("#/$defs/")]
    return obj({name: typed(_types(node)) for name, node in root["properties"].items()})


def obj(properties: dict[str, Any]) -> Schema:
    """An object schema: ``properties`` by name, each a schema or a JSON type name (or a list
    of them)."""
    props = {k: {"type": v} if isinstance(v, str | list) else v for k, v in properties.items()}
    return {"type": "object", "properties": props}


def with_errors(schema: Schema) -> Schema:
    """``schema``, checked to admit the error form as well (see the module's docstring).

    Raises:
        ValueError: a success field is named like an error field.
    """
    properties = schema.get("properties", {})
    clash = set(properties) & set(ERROR_FIELDS)
    if clash:
        raise ValueError(f"output fields {sorted(clash)} clash with the error form")
    return {"type": "object", "properties": properties}


def no_titles(schema: Any) -> Any:
    """An input schema without pydantic's ``title`` s (a property's title repeats its name)."""
    if isinstance(schema, dict):
        return {
            k: no_titles(v) for k, v in schema.items() if not (k == "title" and isinstance(v, str))
        }
    if isinstance(schema, list):
        return [no_titles(item) for item in schema]
    return schema
