"""The fuzzing suite covers every op: a strategy and published schemas for each op of
``contracts/ops.py``, valid requests that the published schema accepts, and mutations that
it refuses."""

from __future__ import annotations

import json

import jsonschema  # type: ignore[import-untyped]
import pytest
from hypothesis import HealthCheck, given, settings

from contracts.ops import OPS
from tests.contract.strategies import (
    SCHEMAS,
    STRATEGIES,
    Case,
    reply_schema,
    request_schema,
    valid,
)
from tests.contract.test_fuzz_mcp import TOOL_OPS


def test_every_op_has_a_strategy() -> None:
    missing = sorted(set(OPS) - set(STRATEGIES))
    assert not missing, f"ops without a fuzzing strategy (tests/contract/strategies.py): {missing}"
    unknown = sorted(set(STRATEGIES) - set(OPS))
    assert not unknown, f"strategies for ops that do not exist: {unknown}"


def test_every_op_has_published_schemas() -> None:
    for key in OPS:
        assert (SCHEMAS / f"{key}.request.json").is_file(), key
        assert (SCHEMAS / f"{key}.reply.json").is_file(), key
        jsonschema.Draft202012Validator.check_schema(request_schema(key))
        jsonschema.Draft202012Validator.check_schema(reply_schema(key))


def test_mcp_tools_name_real_ops() -> None:
    assert set(TOOL_OPS.values()) <= set(OPS)


@pytest.mark.parametrize("key", sorted(OPS))
def test_valid_requests_match_the_published_schema(key: str) -> None:
    """The generator's ``valid`` requests are what the schema accepts (else the fuzzing of
    valid requests would test nothing but refusals)."""
    validator = jsonschema.Draft202012Validator(request_schema(key))

    @settings(max_examples=25, suppress_health_check=[HealthCheck.too_slow])
    @given(case=valid(OPS[key]))
    def one(case: Case) -> None:
        errors = list(validator.iter_errors(json.loads(case.payload)))
        assert not errors, errors[0].message

    one()


@pytest.mark.parametrize("key", sorted(OPS))
def test_strategy_draws(key: str) -> None:
    """Every op's strategy draws (valid and mutated cases) without error."""

    @settings(max_examples=15, suppress_health_check=[HealthCheck.too_slow])
    @given(case=STRATEGIES[key])
    def one(case: Case) -> None:
        assert case.kind and isinstance(case.payload, bytes)

    one()
