"""he/cost.py's encode-at-use term: masks past the evaluator's encoded-mask budget, counted as the evaluator does."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from veil.he.compiler import compile
from veil.he.cost import ENCODE_NS, plan_cost
from veil.he.evaluate import PlanEvaluator

_SPEC = importlib.util.spec_from_file_location("he_test_conv_cost", Path(__file__).with_name("test_conv.py"))
_CONV = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(_CONV)


def _unencoded_masks(evaluator: PlanEvaluator) -> int:
    """Masks the evaluator keeps as float32 values (encoded at each use) instead of SEAL plaintexts."""
    return sum(isinstance(term[3], tuple) for op in evaluator.encoded if isinstance(op, list)
               for out in op for term in out[0])


@pytest.fixture(scope="module")
def plan():
    return compile(_CONV.exported("conv_pair"), mode="latency")  # two convs and a head: masks at three levels


def test_without_a_budget_every_mask_counts_as_encoded_at_load(plan) -> None:
    free, roomy = plan_cost(plan), plan_cost(plan, encoded_bytes=1 << 40)
    assert free["masks_encoded_at_use"] == roomy["masks_encoded_at_use"] == 0
    assert free["encode_seconds"] == roomy["encode_seconds"] == 0
    assert roomy["predicted_seconds"] == pytest.approx(free["predicted_seconds"])
    assert free["encoded_bytes_left"] is None


@pytest.mark.parametrize("share", [0.0, 0.3, 0.7])
def test_masks_past_the_budget_are_the_evaluators_and_cost_their_encodes(plan, share: float) -> None:
    params = plan.parameters()
    everything = PlanEvaluator(plan, params, encoded_bytes=1 << 40)
    total = (1 << 40) - everything.encoded_bytes_left  # the bytes of every mask, encoded
    budget = int(share * total)
    evaluator = PlanEvaluator(plan, params, encoded_bytes=budget)
    cost, free = plan_cost(plan, encoded_bytes=budget), plan_cost(plan)
    assert cost["masks_encoded_at_use"] == _unencoded_masks(evaluator) > 0
    assert cost["encoded_bytes_left"] == evaluator.encoded_bytes_left
    assert cost["encode_seconds"] > 0
    assert cost["predicted_seconds"] == pytest.approx(free["predicted_seconds"] + cost["encode_seconds"])
    if share == 0.0:  # every mask at use: (c + d k) N ns each, k the data primes where its op runs
        n = params.poly_modulus_degree
        assert cost["encode_seconds"] >= cost["masks_encoded_at_use"] * (ENCODE_NS[0] + ENCODE_NS[1]) * n * 1e-9
