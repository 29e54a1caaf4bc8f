"""E²LoRA (spec §2.5): proxy entropy, RMI, partition and rank allocation against direct numpy computations,
real sharing and its parameter count, the un-shared LoRA export (veil and ``peft``), config round trip, registry."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import peft
import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification
from veil.training.adapters import AdapterModel, E2LoraConfig, LoraConfig, inject
from veil.training.adapters.e2lora import (
    E2LoraModel,
    allocate_ranks,
    partition,
    plan_sharing,
    proxy_entropy,
    rmi_matrix,
    thresholds,
)
from veil.training.adapters.e2lora.plan import plan_from_gradients
from veil.training.adapters.registry import get_method

from veil.config import ConfigError

from .conftest import TINY

C = 0.5 * math.log(2 * math.pi) + 0.5
Q, V = "bert.encoder.layer.{}.attention.self.query", "bert.encoder.layer.{}.attention.self.value"
PLAN = {Q: [[0, 1, 3], [2, 3, 5]], V: [[0, 0, 4], [1, 3, 4]]}
KW = {"r": 4, "lora_alpha": 8, "target_modules": ["query", "value"], "modules_to_save": ["classifier"]}


def bert4(seed: int = 0) -> BertForSequenceClassification:
    torch.manual_seed(seed)
    return BertForSequenceClassification(BertConfig(**{**TINY, "num_hidden_layers": 4})).eval()


def np_h(x: np.ndarray) -> float:
    return float(np.log(np.std(x)) + C)


def np_rmi(a: np.ndarray, b: np.ndarray) -> float:
    return (np_h(a) + np_h(b) - np_h(np.concatenate([a, b]))) / min(np_h(a), np_h(b))


def test_entropy_of_gaussian_samples() -> None:
    s = 0.37
    g = torch.randn(400_000, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * s
    assert abs(proxy_entropy(g) - 0.5 * math.log(2 * math.pi * math.e * s * s)) < 5e-3
    x = np.random.default_rng(1).normal(size=(7, 5)) * 0.01
    assert abs(proxy_entropy(torch.from_numpy(x)) - np_h(x.ravel())) < 1e-12


def test_rmi_definition_and_numpy_parity() -> None:
    rng = np.random.default_rng(2)
    g = rng.normal(size=1000)
    g -= g.mean()
    perm = torch.from_numpy(rng.permutation(g))
    rmi = rmi_matrix([torch.from_numpy(g), torch.from_numpy(g), perm])
    assert torch.allclose(rmi, torch.ones(3, 3, dtype=torch.float64), atol=1e-12)  # equal std -> RMI = 1 (§2.4)
    xs = [rng.normal(size=n) * s for n, s in [(300, 1e-3), (200, 2e-3), (500, 1e-1)]]
    rmi = rmi_matrix([torch.from_numpy(x) for x in xs])
    want = np.array([[1.0 if i == j else np_rmi(xs[i], xs[j]) for j in range(3)] for i in range(3)])
    assert np.allclose(rmi.numpy(), want, atol=1e-12) and torch.equal(rmi, rmi.T)
    assert 0.93 < rmi[0, 1] < 0.98 and 0.9 < rmi[0, 2] < 0.97  # the spec's 0.957 / 0.937 (sampling error)
    tau = thresholds(rmi).numpy()
    assert np.allclose(tau, [(want[m].sum() - 1) / 2 for m in range(3)])


HAND = torch.tensor([[1, .9, .6, .2], [.9, 1, .8, .3], [.6, .8, 1, .7], [.2, .3, .7, 1]], dtype=torch.float64)


def test_partition_hand_made_fixture() -> None:
    """τ = (.567, .667, .7, .4): the start layer's τ gives [0..2][3]; the candidate's gives [0,1][2,3]."""
    assert partition(HAND, "start") == [(0, 2), (3, 3)]
    assert partition(HAND, "candidate") == [(0, 1), (2, 3)]


@pytest.mark.parametrize("seed", range(5))
def test_partition_is_contiguous_disjoint_and_covering(seed: int) -> None:
    a = torch.rand(7, 7, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    rmi = (a + a.T) / 2
    rmi.fill_diagonal_(1.0)
    for rule in ("start", "candidate"):
        spans = partition(rmi, rule)
        assert [i for a_, b in spans for i in range(a_, b + 1)] == list(range(7))


def test_rank_allocation() -> None:
    h = [2.0, 3.0, 5.0]
    assert allocate_ranks(h, 8, 24) == [round(x / 10 * 24) for x in h] == [5, 7, 12]
    neg = [-6.0, -5.0, -4.5]
    ranks = allocate_ranks(neg, 8, 24, "entropy_power")
    w = np.exp(neg)
    assert ranks == [max(1, round(x)) for x in w / w.sum() * 24] and ranks == sorted(ranks)
    assert abs(sum(ranks) - 24) <= len(ranks) / 2


def test_plan_from_gradients_matches_numpy() -> None:
    rng = np.random.default_rng(3)
    scales = [1e-3, 1.1e-3, 5e-3, 5.2e-3, 5.1e-3, 2e-2]
    grads = {t.format(i): torch.from_numpy(rng.normal(size=(16, 16)) * s) for i, s in enumerate(scales) for t in (Q, V)}
    cfg = E2LoraConfig(**KW, gradient_scope="layer")
    plan = plan_from_gradients(grads, cfg)
    per_layer = [np.concatenate([grads[Q.format(i)].numpy().ravel(), grads[V.format(i)].numpy().ravel()])
                 for i in range(6)]
    rmi = np.array([[1.0 if i == j else np_rmi(per_layer[i], per_layer[j]) for j in range(6)] for i in range(6)])
    spans = partition(torch.from_numpy(rmi))
    h = [np_h(g) for g in per_layer]
    ranks = allocate_ranks([max(h[a:b + 1]) for a, b in spans], 4, 4 * len(spans))
    assert plan[Q] == plan[V] == [[a, b, r] for (a, b), r in zip(spans, ranks, strict=True)]
    per_module = plan_from_gradients(grads, cfg.replace(gradient_scope="module"))
    assert set(per_module) == {Q, V} and all(iv[-1][1] == 5 for iv in per_module.values())


def test_plan_sharing_probe_restores_the_model(tokens) -> None:
    base = bert4()
    before = {n: p.requires_grad for n, p in base.named_parameters()}
    cfg = plan_sharing(base, E2LoraConfig(**KW), lambda m: m(**tokens).logits.square().mean())
    assert {n: p.requires_grad for n, p in base.named_parameters()} == before
    assert all(p.grad is None for p in base.parameters())
    for iv in cfg.share_intervals.values():
        assert iv[0][0] == 0 and iv[-1][1] == 3 and all(a[1] + 1 == b[0] for a, b in itertools.pairwise(iv))
    assert type(inject(base, cfg)) is E2LoraModel


def test_sharing_is_real_and_parameter_count_follows_the_formula(tokens) -> None:
    model = inject(bert4(), E2LoraConfig(**KW, share_intervals=PLAN))
    layers = model.adapter_layers()
    assert layers[Q.format(0)].lora_A.weight is layers[Q.format(1)].lora_A.weight
    assert layers[V.format(1)].lora_B.weight is layers[V.format(3)].lora_B.weight
    assert layers[Q.format(1)].lora_A.weight is not layers[Q.format(2)].lora_A.weight
    d, head = TINY["hidden_size"], TINY["hidden_size"] * TINY["num_labels"] + TINY["num_labels"]
    adapters = sum(r * 2 * d for ivs in PLAN.values() for _, _, r in ivs)  # Σ_k r_k (d_in + d_out) per type
    assert model.trainable_report()["trainable"] == adapters + head
    lora = inject(bert4(), LoraConfig(**KW)).trainable_report()["trainable"]
    assert lora - model.trainable_report()["trainable"] == 2 * 4 * 4 * 2 * d - adapters
    with torch.no_grad():
        ref = bert4()(**tokens).logits
        assert (model(**tokens).logits - ref).abs().max() <= 1e-6  # B = 0: starts as the base


def test_export_unshared_lora_reproduces_outputs(tokens, randomize_trainable, tmp_path) -> None:
    model = inject(bert4(), E2LoraConfig(**KW, share_intervals=PLAN))
    randomize_trainable(model)
    model.save_as_lora(tmp_path / "lora")
    cfg = json.loads((tmp_path / "lora" / "adapter_config.json").read_text())
    assert cfg["peft_type"] == "LORA" and cfg["rank_pattern"] == {Q.format(0): 3, Q.format(1): 3, Q.format(2): 5,
                                                                  Q.format(3): 5}
    with torch.no_grad():
        ref = model(**tokens).logits
        ours = AdapterModel.from_pretrained(bert4(), tmp_path / "lora")(**tokens).logits
        theirs = peft.PeftModel.from_pretrained(bert4(), tmp_path / "lora")(**tokens).logits
    assert (ours - ref).abs().max() <= 1e-5 and (theirs - ref).abs().max() <= 1e-5


def test_native_checkpoint_round_trip_and_merge(tokens, randomize_trainable, tmp_path) -> None:
    model = inject(bert4(), E2LoraConfig(**KW, share_intervals=PLAN))
    randomize_trainable(model)
    assert len([k for k in model.adapter_state_dict() if "lora_A" in k]) == 4  # one per interval
    model.save_pretrained(tmp_path / "e2")
    with torch.no_grad():
        ref = model(**tokens).logits
        again = AdapterModel.from_pretrained(bert4(), tmp_path / "e2")
        assert (again(**tokens).logits - ref).abs().max() <= 1e-6
        model.merge()
        assert (model(**tokens).logits - ref).abs().max() <= 1e-5
    assert again.config == model.config


def test_config_round_trip_and_errors(tokens) -> None:
    cfg = E2LoraConfig(**KW, share_intervals=PLAN, threshold_rule="candidate", allocation_weight="entropy_power")
    assert E2LoraConfig.from_json(cfg.to_json()) == cfg
    with pytest.raises(ConfigError, match="threshold_rule"):
        E2LoraConfig(**KW, threshold_rule="end")
    with pytest.raises(ConfigError, match="layer_pattern"):
        E2LoraConfig(**KW, layer_pattern=r"\.\d+\.")
    with pytest.raises(ConfigError, match="share_intervals"):
        E2LoraConfig(**KW, share_intervals={Q: [[2, 1, 4]]})
    with pytest.raises(ValueError, match="plan_sharing"):
        inject(bert4(), E2LoraConfig(**KW))


def test_registry_entry() -> None:
    entry = get_method("e2lora")
    assert entry.config_cls is E2LoraConfig and entry.model_cls is E2LoraModel
