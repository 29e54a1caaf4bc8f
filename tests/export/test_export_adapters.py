"""LoRA export (PEFT-layout adapters made with peft itself): merged vs adapter-as-input parity, stock ORT loading."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import BertConfig, BertModel
from veil.export import ExportError
from veil.export.adapters import export_adapters, read_lora, sentence_encoder_spec
from veil.export.adapters_cli import main as cli_main
from veil.export.encoder import SentenceEncoder, random_tokens

CONFIG = dict(attn_implementation="eager", vocab_size=1100, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
              intermediate_size=32, max_position_embeddings=48)
ADAPTERS = {"tenant1": (4, 8, ["query", "value"]), "tenant2": (2, 4, ["dense"])}  # id -> (r, alpha, targets)


def tiny_encoder() -> tuple[SentenceEncoder, BertConfig]:
    config = BertConfig(**CONFIG)
    torch.manual_seed(0)
    return SentenceEncoder(BertModel(config).eval(), normalize=False).eval(), config


def save_adapter(base: BertModel, folder: Path, r: int, alpha: int, targets: list[str], seed: int) -> Path:
    """A PEFT LoRA folder over ``base`` with random (non-zero) A and B."""
    torch.manual_seed(seed)
    peft_model = get_peft_model(BertModel(base.config), LoraConfig(r=r, lora_alpha=alpha, target_modules=targets,
                                                                   init_lora_weights=False))
    peft_model.save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("adapters")
    model, config = tiny_encoder()
    folders = {i: save_adapter(model.encoder, root / i, *spec, seed=n) for n, (i, spec) in enumerate(ADAPTERS.items())}
    manifest = export_adapters(model, sentence_encoder_spec(config), folders, root / "repo", "tiny", merged_models=True)
    return {"root": root, "repo": root / "repo", "manifest": manifest, "model": model, "config": config, "folders": folders}


def session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def run(sess: ort.InferenceSession, feeds: dict, adapter: Path | None = None) -> np.ndarray:
    options = ort.RunOptions()
    if adapter is not None:
        loaded = ort.LoraAdapter()
        loaded.Load(str(adapter))  # stock ONNX Runtime, nothing from veil
        options.add_active_adapter(loaded)
    return sess.run(["sentence_embedding"], feeds, run_options=options)[0]


def test_merged_equals_adapter_as_input_and_no_adapter_is_base(exported: dict) -> None:
    repo, model, config = exported["repo"], exported["model"], exported["config"]
    graph = session(repo / "tiny" / "1" / "model.onnx")
    assert [i.name for i in graph.get_inputs()] == ["input_ids", "attention_mask"]  # A/B: overridable initializers
    inputs = random_tokens(config.vocab_size, batch=3, sequence=9, seed=7)
    feeds = {k: v.numpy() for k, v in inputs.items()}
    with torch.no_grad():
        base = model(*inputs.values()).numpy()
    assert np.abs(run(graph, feeds) - base).max() <= 1e-5
    for adapter_id in ADAPTERS:
        merged = run(session(repo / f"tiny-{adapter_id}" / "1" / "model.onnx"), feeds)
        with_adapter = run(graph, feeds, repo / "tiny" / "adapters" / f"{adapter_id}.onnx_adapter")
        assert np.abs(with_adapter - merged).max() <= 1e-5
        assert np.abs(with_adapter - base).max() > 1e-3  # the adapter really changes the output


def test_manifest_lists_adapters_and_graph_inputs(exported: dict) -> None:
    manifest = json.loads((exported["repo"] / "tiny" / "veil.json").read_text())
    rows = {row["id"]: row for row in manifest["adapters"]}
    assert set(rows) == set(ADAPTERS) and manifest["lora"]["rank"] == 4
    assert rows["tenant1"]["rank"] == 4 and rows["tenant1"]["alpha"] == 8 and len(rows["tenant1"]["sha256"]) == 64
    assert all("attention.self.query" in t or "attention.self.value" in t for t in rows["tenant1"]["targets"])
    for case in rows["tenant2"]["parity"]["cases"]:
        assert case["sentence_embedding"]["max_abs_diff_vs_merged"] <= 1e-5
    graph = onnx.load(str(exported["repo"] / "tiny" / "1" / "model.onnx"))
    zeros = {t.name: onnx.numpy_helper.to_array(t) for t in graph.graph.initializer if t.name.startswith("lora.")}
    assert set(zeros) == set(manifest["lora"]["inputs"]) and all(not z.any() for z in zeros.values())
    assert {i.name for i in graph.graph.input} >= set(zeros)
    assert 'key: "adapter_cache_size"' in (exported["repo"] / "tiny" / "config.pbtxt").read_text()


def test_adapter_format_round_trip(exported: dict) -> None:
    fmt = ort.AdapterFormat.read_adapter(str(exported["repo"] / "tiny" / "adapters" / "tenant2.onnx_adapter"))
    params = fmt.get_parameters()
    assert fmt.get_adapter_version() == 1 and fmt.get_model_version() == 1
    assert set(params) == set(json.loads((exported["repo"] / "tiny" / "veil.json").read_text())["lora"]["inputs"])


def test_bad_adapters_are_refused_with_the_field(exported: dict, tmp_path: Path) -> None:
    with pytest.raises(ExportError, match=r"adapter_config\.json"):
        read_lora("x", tmp_path)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "adapter_config.json").write_text(json.dumps({"peft_type": "IA3"}))
    (bad / "adapter_model.safetensors").write_bytes((exported["folders"]["tenant1"] / "adapter_model.safetensors").read_bytes())
    with pytest.raises(ExportError, match="peft_type expected 'LORA', received 'IA3'"):
        read_lora("bad", bad)
    model, config = exported["model"], exported["config"]
    with pytest.raises(ExportError, match="--adapter: expected"):
        export_adapters(model, sentence_encoder_spec(config), {"no/slash": bad}, tmp_path / "repo", "t")


def test_cli_help_shows_an_example(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        cli_main(["--help"])
    assert "veil export adapters bundled:all-MiniLM-L6-v2 --adapter" in capsys.readouterr().out


@pytest.mark.slow
def test_cli_minilm_merged_parity(tmp_path: Path) -> None:
    from veil.export.encoder import load_sentence_encoder, resolve_encoder

    model, _ = load_sentence_encoder(resolve_encoder("bundled:all-MiniLM-L6-v2"))
    folder = save_adapter(model.encoder, tmp_path / "t1", 8, 16, ["query", "value"], seed=3)
    assert cli_main(["bundled:all-MiniLM-L6-v2", "--adapter", f"t1={folder}", "--repo", str(tmp_path / "repo"),
                     "--name", "minilm", "--merged"]) == 0
    manifest = json.loads((tmp_path / "repo" / "minilm" / "veil.json").read_text())
    for case in manifest["adapters"][0]["parity"]["cases"]:
        assert case["sentence_embedding"]["max_abs_diff_vs_merged"] <= 1e-5
    assert (tmp_path / "repo" / "minilm-t1" / "1" / "model.onnx").is_file()


# -- issue 19, item 17: `veil finetune` outputs carry their classifier head --------------------------------------
def finetune_style_run(base: BertModel, folder: Path, labels: list[str], seed: int) -> tuple[Path, torch.nn.Module]:
    """What `veil finetune --method lora` writes for a text task: a LoRA over MeanPoolClassifier (targets under
    ``bert.``) with the head in modules_to_save, finetune.json and metrics.json; and the trained torch model."""
    import copy

    from veil.training.adapters import LoraConfig as VeilLora
    from veil.training.adapters import inject
    from veil.training.adapters.finetune import MeanPoolClassifier

    torch.manual_seed(seed)
    classifier = MeanPoolClassifier(copy.deepcopy(base), len(labels))
    model = inject(classifier, VeilLora(r=4, lora_alpha=8, target_modules=["query", "value"],
                                        modules_to_save=["classifier"]))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    model.save_pretrained(folder)
    (folder / "finetune.json").write_text(json.dumps({"method": "lora", "task": "number", "seed": seed}))
    (folder / "metrics.json").write_text(json.dumps({"labels": labels, "test_accuracy": 0.5}))
    return folder, model.eval()


def test_a_finetune_run_exports_with_its_head_in_the_graph(tmp_path: Path) -> None:
    """Formerly refused ("LoRA on Linear layers only"): the head becomes the graph's `logits` output, per adapter."""
    model, config = tiny_encoder()
    clf, trained = finetune_style_run(model.encoder, tmp_path / "clf", ["neg", "neu", "pos"], seed=5)
    plain = save_adapter(model.encoder, tmp_path / "plain", 2, 4, ["dense"], seed=6)
    manifest = export_adapters(model, sentence_encoder_spec(config), {"clf": clf, "plain": plain}, tmp_path / "repo",
                               "tiny", merged_models=True)
    rows = {row["id"]: row for row in manifest["adapters"]}
    assert rows["clf"]["head"] == {"num_labels": 3, "labels": ["neg", "neu", "pos"], "output": "logits"}
    assert "head" not in rows["plain"] and manifest["head"]["inputs"] == ["head.weight", "head.bias"]
    graph = ort.InferenceSession(str(tmp_path / "repo" / "tiny" / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    assert [o.name for o in graph.get_outputs()] == ["sentence_embedding", "logits"]
    inputs = random_tokens(config.vocab_size, batch=3, sequence=9, seed=7)
    feeds = {k: v.numpy() for k, v in inputs.items()}
    with torch.no_grad():
        expected = trained(*inputs.values()).numpy()  # the fine-tuned classifier's own logits
    options = ort.RunOptions()
    adapter = ort.LoraAdapter()
    adapter.Load(str(tmp_path / "repo" / "tiny" / "adapters" / "clf.onnx_adapter"))
    options.add_active_adapter(adapter)
    embedding, logits = graph.run(None, feeds, run_options=options)
    np.testing.assert_allclose(logits, expected, atol=1e-5, rtol=1e-5)
    assert graph.run(None, feeds)[1].shape == (3, 0)  # no adapter: no head
    merged = ort.InferenceSession(str(tmp_path / "repo" / "tiny-clf" / "1" / "model.onnx"),
                                  providers=["CPUExecutionProvider"])
    merged_embedding, merged_logits = merged.run(None, feeds)
    np.testing.assert_allclose(merged_logits, expected, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(merged_embedding, embedding, atol=1e-5)
    pbtxt = (tmp_path / "repo" / "tiny" / "config.pbtxt").read_text()
    assert 'name: "logits"' in pbtxt


def test_a_saved_module_that_is_not_a_finetune_head_says_what_to_do(tmp_path: Path) -> None:
    model, _ = tiny_encoder()
    clf, _ = finetune_style_run(model.encoder, tmp_path / "clf", ["a", "b"], seed=1)
    (clf / "finetune.json").unlink()  # a PEFT folder with a head of unknown architecture
    with pytest.raises(ExportError, match=r"saved module.*--mean-pool-head") as refused:
        read_lora("x", clf)  # issue 33.1: not `veil export finetuned`, which refuses a folder without finetune.json
    assert "export finetuned" not in str(refused.value)
