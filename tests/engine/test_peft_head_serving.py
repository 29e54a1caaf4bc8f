"""Issue 33.1: a LoRA that ``peft`` saved over veil's ``MeanPoolClassifier`` (head in ``modules_to_save``, no
finetune.json) is served with its head, and the two exporters' errors lead to the one that takes it, never in a loop."""

from __future__ import annotations

import copy
import json

import numpy as np
import peft
import pytest
import torch
from fastapi.testclient import TestClient
from transformers import BertConfig, BertModel
from veil.engine.server import create_app
from veil.export import ExportError
from veil.export.adapters import read_lora
from veil.export.adapters_cli import main as cli_main
from veil.export.encoder import random_tokens
from veil.export.finetuned import load_run
from veil.training.adapters.finetune import MeanPoolClassifier

CONFIG = dict(attn_implementation="eager", vocab_size=1100, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
              intermediate_size=32, max_position_embeddings=48)


@pytest.fixture(scope="module")
def peft_head(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A peft LoRA (random A, B and head) over a tiny MeanPoolClassifier, saved by peft; the shared encoder."""
    root = tmp_path_factory.mktemp("peft-head")
    torch.manual_seed(0)
    encoder = BertModel(BertConfig(**CONFIG)).eval()
    classifier = MeanPoolClassifier(copy.deepcopy(encoder), num_labels=3)
    model = peft.get_peft_model(classifier, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["query", "value"],
                                                            modules_to_save=["classifier"], task_type="SEQ_CLS",
                                                            init_lora_weights=False))
    with torch.no_grad():
        model.base_model.model.classifier.modules_to_save["default"].weight.normal_(0, 0.5)
    model.save_pretrained(str(root / "peft"))
    return {"root": root, "folder": root / "peft", "model": model.eval(), "encoder": encoder}


def test_a_peft_saved_head_is_served_with_the_peft_models_logits(peft_head: dict, oip, capsys) -> None:
    root = peft_head["root"]
    peft_head["encoder"].save_pretrained(root / "encoder")  # the base encoder as a transformers folder
    assert cli_main([str(root / "encoder"), "--adapter", f"p={peft_head['folder']}", "--mean-pool-head",
                     "--repo", str(root / "repo"), "--name", "tiny"]) == 0
    assert json.loads(capsys.readouterr().out)["adapters"][0]["id"] == "p"
    manifest = json.loads((root / "repo" / "tiny" / "veil.json").read_text())
    assert manifest["adapters"][0]["head"]["num_labels"] == 3
    tokens = random_tokens(CONFIG["vocab_size"], batch=3, sequence=7, seed=4)
    tokens["attention_mask"][0, 4:] = 0  # padding: the mean is over the real tokens only
    with torch.no_grad():
        expected = peft_head["model"](**tokens).logits.numpy()  # peft's own forward of its saved model
    with TestClient(create_app(oip.make_config(root / "repo"))) as client:
        content, headers = oip.binary_body([(k, "INT64", v.numpy()) for k, v in tokens.items()])
        r = client.post("/v2/models/tiny:p/infer", content=content, headers=headers)
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(oip.decode(r)["logits"], expected, atol=1e-4, rtol=0)


def test_the_two_exporters_point_to_the_one_that_takes_the_folder(peft_head: dict) -> None:
    folder = peft_head["folder"]
    with pytest.raises(ExportError, match="--mean-pool-head") as refused:
        read_lora("p", folder)  # no finetune.json: nothing says what the head computes
    assert "export finetuned" not in str(refused.value)
    with pytest.raises(ExportError, match=r"finetune\.json.*veil export adapters .*--mean-pool-head"):
        load_run(folder)
    assert read_lora("p", folder, mean_pool_head=True).head[0].shape == (3, CONFIG["hidden_size"])
