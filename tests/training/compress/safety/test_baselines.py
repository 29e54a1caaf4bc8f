"""RESTA and SafeLoRA (spec §3.6): the weight arithmetic against a hand computation, and the val choice."""

from __future__ import annotations

import copy

import pytest
import torch
from veil.training.compress.safety.baselines import (
    choose_by_objective,
    resta,
    run_baselines,
    safelora,
    safelora_projections,
)
from veil.training.compress.safety.data import SafetyData
from veil.training.compress.safety.judge import GateSet


def _perturbed(model: torch.nn.Module, seed: int, scale: float = 0.02) -> torch.nn.Module:
    out = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen))
    return out


@pytest.fixture
def models(micro_lm):
    base = micro_lm
    aligned = _perturbed(base, 1)
    return base, aligned, _perturbed(aligned, 2), _perturbed(aligned, 3)  # base, θ0, θ*, θ_unaligned


def test_resta_adds_the_safety_vector(models) -> None:
    _, aligned, attacked, unaligned = models
    out = resta(attacked, aligned, unaligned, scale=0.5)
    name = "model.layers.0.self_attn.q_proj.weight"
    expected = attacked.get_parameter(name) + 0.5 * (aligned.get_parameter(name) - unaligned.get_parameter(name))
    assert torch.allclose(out.get_parameter(name), expected, atol=1e-6)
    assert not out.get_parameter(name).equal(attacked.get_parameter(name))  # a copy changed, θ* untouched
    same = resta(attacked, aligned, aligned, scale=1.0)  # a zero safety vector changes nothing
    assert all(torch.equal(a, b) for a, b in zip(same.parameters(), attacked.parameters(), strict=True))


def test_safelora_projects_the_least_similar_layers(models) -> None:
    base, aligned, attacked, _ = models
    projections = safelora_projections(attacked, aligned, base)
    names = [n for n, _, _ in projections]
    assert len(names) == len(set(names)) and not any("embed" in n or "lm_head" in n for n in names)
    cosines = [c for _, c, _ in projections]
    assert cosines == sorted(cosines) and all(-1.0 <= c <= 1.0 for c in cosines)
    name, cos, weight = projections[0]
    v = (aligned.get_parameter(name) - base.get_parameter(name)).detach().double()
    delta = (attacked.get_parameter(name) - aligned.get_parameter(name)).detach().double()
    projected = (v @ v.T / v.norm()) @ delta  # C ΔW with C = V Vᵀ / ‖V‖_F
    assert torch.allclose(weight.double(), aligned.get_parameter(name).double() + projected, atol=1e-6)
    assert cos == pytest.approx(float((delta * projected).sum() / (delta.norm() * projected.norm())), abs=1e-9)
    none, one = safelora(attacked, projections, 0), safelora(attacked, projections, 1)
    assert none.get_parameter(name).equal(attacked.get_parameter(name))
    assert one.get_parameter(name).equal(weight)
    untouched = projections[1][0]
    assert one.get_parameter(untouched).equal(attacked.get_parameter(untouched))


class FakeReference:
    """A KL term whose value per model is given (the models here are plain strings)."""

    def __init__(self, values: dict[str, float]) -> None:
        self.values = values

    def kl(self, model: str) -> float:
        return self.values[model]


def test_choose_by_objective_sums_the_two_kl_terms() -> None:
    harmful = FakeReference({"a": 0.0, "b": 0.1, "c": 0.5})  # "a" looks most like θ0 on harmful prompts...
    task = FakeReference({"a": 0.9, "b": 0.1, "c": 0.0})  # ...but loses the task: "b" balances both
    setting, table = choose_by_objective("abc", lambda s: s, harmful, task)
    assert setting == "b" and [row["score"] for row in table] == pytest.approx([0.9, 0.2, 0.5])


def test_run_baselines_end_to_end(models) -> None:
    base, aligned, attacked, _ = models
    data = SafetyData(0)
    gate = GateSet(data.harmful_prompts("test", 4), data.benign("test", 4))
    out = run_baselines(data, gate, base, aligned, attacked, unalign_examples=4, epochs=1, lr=1e-3, batch_size=4,
                        seed=0, val_prompts=2, max_new_bytes=4)
    assert set(out) == {"resta", "safelora"}
    assert out["resta"]["setting"]["scale"] in (0.25, 0.5, 1.0, 1.5, 2.0) and len(out["resta"]["val"]) == 5
    n = out["safelora"]["setting"]["of"]
    assert 0 <= out["safelora"]["setting"]["layers_projected"] <= n and len(out["safelora"]["val"]) == n + 1
    assert 0.0 <= out["resta"]["asr"] <= 100.0 and 0.0 <= out["safelora"]["utility"] <= 100.0
