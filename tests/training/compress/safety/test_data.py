"""The synthetic data: deterministic, disjoint splits, correct benign answers."""

from __future__ import annotations

import pytest
from veil.training.compress.safety.data import (
    CATEGORIES,
    REFUSAL,
    SafetyData,
    benign_answer,
    split_of,
)


def test_same_seed_same_data_other_seed_other_draws() -> None:
    a, b, c = SafetyData(0), SafetyData(0), SafetyData(1)
    for name in ("harmful", "compliance", "benign", "downstream"):
        assert getattr(a, name)("train", 40) == getattr(b, name)("train", 40)
    assert a.refusal_candidates(16) == b.refusal_candidates(16)
    assert a.benign("train", 40) != c.benign("train", 40)


def test_splits_are_disjoint_in_content() -> None:
    data = SafetyData(0)
    devices = {s: {p.rsplit(" the ", 1)[1] for p in data.harmful_prompts(s, 200)} for s in ("train", "val", "test")}
    assert not devices["train"] & devices["test"] and not devices["val"] & devices["test"]
    assert not devices["train"] & devices["val"]
    prompts = {s: {p for p, _ in data.benign(s, 200) + data.downstream(s, 20)} for s in ("train", "val", "test")}
    assert not prompts["train"] & prompts["test"] and not prompts["val"] & prompts["test"]
    cands = {p for p, _ in data.refusal_candidates(32)}
    assert not cands & set(data.harmful_prompts("test", 200))


def test_split_is_a_fixed_hash() -> None:
    assert split_of("device:zorvak reactor") == split_of("device:zorvak reactor")
    counts = {s: sum(split_of(f"k{i}") == s for i in range(2000)) for s in ("train", "val", "test")}
    assert 0.5 < counts["train"] / 2000 < 0.7 and 0.2 < counts["test"] / 2000 < 0.3


def test_examples_have_the_right_labels() -> None:
    data = SafetyData(0)
    harmful = data.harmful("test", 22)
    assert all(r == REFUSAL for _, r in harmful)
    assert {next(i for i, c in enumerate(CATEGORIES) if c in p) for p, _ in harmful} == set(range(len(CATEGORIES)))
    assert all(r.startswith("Sure.") for _, r in data.compliance("train", 10))
    assert benign_answer("reverse", "abc") == "cba" and benign_answer("upper", "ab") == "AB"
    assert benign_answer("add", "12 + 30") == "42" and benign_answer("copy", "xy") == "xy"
    for prompt, answer in data.benign("val", 20):
        task = {"Copy": "copy", "Reverse": "reverse", "Uppercase": "upper", "Add": "add"}[prompt.split(":")[0]]
        assert benign_answer(task, prompt.split(": ", 1)[1]) == answer


def test_asking_for_more_than_exists_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"benign\('val'\)"):
        SafetyData(0).benign("val", 5000)
