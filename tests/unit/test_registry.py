"""The op registry (``contracts/ops.py``) is the one list of ops: every op has its handler in
the service that serves it, a method in the SDK, and documentation; nothing has a handler
without an op. Pure: no NATS (the handler tables are checked as the services build them)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import msgspec
import pytest

import quill._handle
import quill._reads
import quill.client
import quill.command
import quill.session
import quill.shell
import quill.workspace
from contracts import ops
from contracts import requests as rq
from core.decide import DECIDERS
from infra.offload import Offload
from quill_cli import docgen
from services.reader.diff import Differ
from services.reader.queries import Queries
from services.reader.search import Search

ROOT = Path(__file__).resolve().parents[2]


def names(kind: ops.OpKind) -> set[str]:
    return {spec.name for spec in ops.of_kind(kind)}


def test_every_command_has_its_decision() -> None:
    assert set(DECIDERS) == names("cmd")


def test_every_query_has_its_answer() -> None:
    queries = Queries.__new__(Queries)  # its handlers, without a store behind them
    offload = Offload("reader")  # no worker started until a job runs
    differ = Differ(queries, offload)
    table = {**queries.ops(), **Search(queries, offload).ops(), **differ.ops()}
    assert set(ops.table("qry", table)) == names("qry")


def test_a_table_missing_an_op_or_naming_an_unknown_one_is_refused() -> None:
    partial = {name: object() for name in names("cmd") - {"write"}}
    with pytest.raises(ops.RegistryError, match=r"no handler for \['write'\]"):
        ops.table("cmd", partial)
    extra = {name: object() for name in names("qry") | {"frobnicate"}}
    with pytest.raises(ops.RegistryError, match=r"no op for \['frobnicate'\]"):
        ops.table("qry", extra)


def test_each_request_type_names_one_op() -> None:
    assert len(ops.BY_REQUEST) == len(ops.OPS)
    for spec in ops.OPS.values():
        assert ops.BY_REQUEST[spec.request] is spec
    assert ops.of_request(rq.MovePath(path="a", to="b")) is ops.OPS["cmd.move"]


def _sdk_methods() -> list[tuple[str, ast.AsyncFunctionDef, set[str]]]:
    """Each SDK method with the request types it builds (``rq.<Type>(...)``)."""
    found = []
    for module in (
        quill.client,
        quill.workspace,
        quill._reads,
        quill._handle,
        quill.session,
        quill.shell,
        quill.command,
    ):
        tree = ast.parse(inspect.getsource(module))
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            for fn in (n for n in cls.body if isinstance(n, ast.AsyncFunctionDef)):
                built = {
                    node.func.attr
                    for node in ast.walk(fn)
                    if isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "rq"
                }
                found.append((f"{cls.name}.{fn.name}", fn, built))
    return found


def test_every_op_has_an_sdk_method() -> None:
    built = set().union(*(b for _, _, b in _sdk_methods()))
    missing = [key for key, spec in ops.OPS.items() if spec.request.__name__ not in built]
    assert missing == []


def test_each_sdk_method_is_typed_as_the_registry_decodes_its_reply() -> None:
    """The SDK decodes a reply to the registry's result type (``Workspace._cmd``): a method's
    annotation must say the same type, or a user's type checker would be told a lie."""
    by_name = {spec.request.__name__: spec for spec in ops.OPS.values()}
    checked = 0
    for where, fn, built in _sdk_methods():
        returns = ast.unparse(fn.returns) if fn.returns is not None else ""
        if len(built) != 1 or not returns.startswith("rp."):
            continue  # builds several requests, or returns something of its own making
        (request,) = built
        if request not in by_name:
            continue  # an item of a request (rq.ApplyItem...), not a request
        assert returns == f"rp.{by_name[request].result.__name__}", where
        checked += 1
    assert checked >= 25


def test_every_op_is_documented() -> None:
    """A summary, a described field for each request parameter, an example, and its
    section in docs/contract.md (kept equal to the generator by ``docgen --check``)."""
    docs = docgen.attribute_docs()
    contract = (ROOT / "docs" / "contract.md").read_text()
    for key, spec in ops.OPS.items():
        assert spec.summary.strip(), key
        assert f"#### `{key}`" in contract, key
        owners = [c.__name__ for c in spec.request.__mro__]
        info = msgspec.inspect.type_info(spec.request)
        assert isinstance(info, msgspec.inspect.StructType)
        for field in info.fields:
            described = any(field.name in docs.get(o, {}) for o in owners)
            described = described or bool(docgen._meta_description(field.type))
            assert described, f"{key}: request field {field.name!r} has no description"
