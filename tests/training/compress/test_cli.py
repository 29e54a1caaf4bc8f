"""`veil compress` on a tiny LM checkpoint: outputs, the summary JSON, and exit status 2 naming the bad field."""

from __future__ import annotations

import json

import pytest
from veil.training.compress.cli import build_parser, main


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from veil.training.lm import PRESETS, LMModelConfig, LMTrainConfig, load_pydoc_topics, save_lm, train_lm

    corpus = load_pydoc_topics()
    train = LMTrainConfig(steps=5, batch_size=4, block_size=32, eval_every=5, eval_blocks=2)
    result = train_lm(LMModelConfig(**PRESETS["micro"]), train, corpus, progress=False)
    return save_lm(result, tmp_path_factory.mktemp("lm") / "ck", corpus)


def test_compress_lm_checkpoint(checkpoint, tmp_path, capsys) -> None:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("seed: 0\nstages:\n  - method: saes_svd\n    ratio: 0.4\n    ignore: [lm_head]\n")
    out = tmp_path / "out"
    code = main([str(checkpoint), "--recipe", str(recipe), "--calibration", "bundled:pydoc_topics", "--out", str(out),
                 "--num-sequences", "4", "--seq-len", "32", "--batch-size", "2", "--eval-sequences", "4"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    summary = json.loads(captured.out)
    assert summary["parameters"]["factorised_layers"]["layers"] == 14
    assert set(summary["metrics"]["after"]) == {"held_out_loss", "held_out_perplexity"}
    assert "[saes_svd] model.layers.0.self_attn.q_proj" in captured.err  # one log line per module
    assert {p.name for p in out.iterdir()} == {"model.safetensors", "config.json", "report.json", "report.md"}


@pytest.mark.parametrize("recipe_text,field", [
    ("stages:\n  - method: nope\n", "method"),
    ("stages:\n  - method: svd\n    ratio: 1.5\n", "ratio"),
    ("stages: []\n", "stages"),
])
def test_bad_recipe_exit_2(checkpoint, tmp_path, capsys, recipe_text, field) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(recipe_text)
    code = main([str(checkpoint), "--recipe", str(recipe), "--calibration", "bundled:pydoc_topics",
                 "--out", str(tmp_path / "o")])
    assert code == 2 and field in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_bad_inputs_exit_2(checkpoint, tmp_path, capsys) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text("stages:\n  - method: svd\n")
    assert main([str(checkpoint), "--recipe", str(recipe), "--calibration", str(tmp_path / "missing.txt"),
                 "--out", str(tmp_path / "o")]) == 2
    assert "--calibration" in capsys.readouterr().err
    assert main([str(checkpoint), "--recipe", str(recipe), "--calibration", "bundled:pydoc_topics",
                 "--out", str(tmp_path / "o"), "--seq-len", "0"]) == 2
    assert "--seq-len" in capsys.readouterr().err
    assert "veil compress runs/lm --recipe" in build_parser().format_help()


def test_compress_sentence_encoder_and_reload(tmp_path, capsys) -> None:
    """The encoder path: MiniLM with plain SVD (fast), embedding cosine in the report, reload gives the same output."""
    import torch
    from veil.training.compress.api import load_compressed
    from veil.training.compress.workloads import minilm

    recipe = tmp_path / "r.yaml"
    recipe.write_text("stages:\n  - method: svd\n    ratio: 0.2\n    targets: ['re:.*layer[.]0[.].*']\n")
    out = tmp_path / "out"
    code = main(["bundled:all-MiniLM-L6-v2", "--recipe", str(recipe), "--calibration", "bundled:pydoc_topics",
                 "--out", str(out), "--num-sequences", "4", "--eval-sequences", "4", "--no-progress"])
    summary = json.loads(capsys.readouterr().out)
    assert code == 0 and summary["parameters"]["factorised_layers"]["layers"] == 6
    assert 0.5 < summary["metrics"]["after"]["mean_cosine"] < 1.0
    reloaded, config = load_compressed(out)
    assert config["base"]["type"] == "sentence_encoder" and len(config["factorized"]) == 6
    _, tokenizer = minilm()
    batch = tokenizer(["hello world", "a longer test sentence"], padding=True, return_tensors="pt")
    with torch.no_grad():
        emb = reloaded(batch["input_ids"], batch["attention_mask"])
    assert emb.shape == (2, 384) and torch.isfinite(emb).all()
