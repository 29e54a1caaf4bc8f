"""Issue 33.1: a veil text adapter loaded onto the wrong base is loud in veil; ``peft_base`` refuses a folder
without a ``MeanPoolClassifier`` head (the PEFT round trip itself: test_finetune_cli.py)."""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification, BertModel
from veil.training.adapters import AdapterModel, LoraConfig, inject, peft_base
from veil.training.adapters.finetune import MeanPoolClassifier

CONFIG = dict(vocab_size=100, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
              num_labels=2)


def saved_text_adapter(folder: Path, head: bool = True) -> Path:
    torch.manual_seed(0)
    model = inject(MeanPoolClassifier(BertModel(BertConfig(**CONFIG)), 2),
                   LoraConfig(r=2, target_modules=["query"], modules_to_save=["classifier"] if head else None))
    model.save_pretrained(folder)
    return folder


def test_loading_onto_another_base_class_warns(tmp_path: Path) -> None:
    folder = saved_text_adapter(tmp_path / "a")
    with pytest.warns(UserWarning, match="expected a MeanPoolClassifier .*received a BertForSequenceClassification"):
        AdapterModel.from_pretrained(BertForSequenceClassification(BertConfig(**CONFIG)), folder)  # keys fit
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        AdapterModel.from_pretrained(MeanPoolClassifier(BertModel(BertConfig(**CONFIG)), 2), folder)


def test_peft_base_needs_the_saved_head(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"expected the head 'base_model.model.classifier.weight'"):
        peft_base(saved_text_adapter(tmp_path / "b", head=False))
    with pytest.raises(ValueError, match=r"adapter_config\.json \(PEFT layout\), it is missing"):
        peft_base(tmp_path / "nothing")


def test_mean_pool_classifier_refuses_keywords_it_cannot_honour() -> None:
    model = MeanPoolClassifier(copy.deepcopy(BertModel(BertConfig(**CONFIG))), 2)
    ids = torch.randint(0, 100, (2, 5))
    with pytest.raises(TypeError, match=r"received \['output_hidden_states'\]"):
        model(input_ids=ids, output_hidden_states=True)
    assert model(ids, torch.ones_like(ids)).shape == (2, 2) and model.config is model.bert.config
