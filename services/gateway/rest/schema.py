"""The pieces the REST rooms write their OpenAPI paths and schemas with: one spelling of a
JSON object, an array, a request body and a path parameter, so that a room's ``paths`` says
what its answers hold and nothing else."""

from __future__ import annotations

from typing import Any

STR: Any = {"type": "string"}
INT: Any = {"type": "integer"}
BOOL: Any = {"type": "boolean"}
WORKSPACE_NAME: Any = {"type": "string", "pattern": "^[a-z0-9][a-z0-9_-]{0,63}$"}
"""A workspace's name within its tenant (``contracts.subjects.check_id``)."""


def obj(
    *, required: tuple[str, ...] = (), closed: bool = False, about: str = "", **props: Any
) -> dict[str, Any]:
    """A JSON object of ``props`` (a property whose name is no identifier: pass a dict as
    ``**{"from": STR}``); ``required`` names, ``closed``: no other property, ``about``: its
    description."""
    schema: dict[str, Any] = {"type": "object"}
    if required:
        schema["required"] = list(required)
    if closed:
        schema["additionalProperties"] = False
    if about:
        schema["description"] = about
    schema["properties"] = props
    return schema


def arr(items: dict[str, Any]) -> dict[str, Any]:
    """A JSON array of ``items``."""
    return {"type": "array", "items": items}


def body(schema: Any) -> dict[str, Any]:
    """An OpenAPI request body of JSON by ``schema``."""
    return {"required": True, "content": {"application/json": {"schema": schema}}}


def path_param(name: str, schema: dict[str, Any] = STR) -> dict[str, Any]:
    """An OpenAPI path parameter."""
    return {"name": name, "in": "path", "required": True, "schema": schema}
