"""`veil finetune`: help, tasks, a tiny in-process run that writes a PEFT-layout adapter, and (slow) LoRA beats
the frozen-encoder linear probe."""

from __future__ import annotations

import json

import pytest
from veil.training.adapters.cli import run
from veil.training.adapters.data import TASKS, make_task

from veil.cli import main as veil_main

TINY = ["--train-size", "16", "--val-size", "8", "--test-size", "8", "--epochs", "1", "--no-progress"]


def test_help_has_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    assert veil_main(["finetune", "--help"]) == 0
    out = capsys.readouterr().out
    assert "example:" in out and "--method" in out and "--task" in out


@pytest.mark.parametrize("name", sorted(TASKS))
def test_tasks_are_deterministic_balanced_and_disjoint(name: str) -> None:
    a, b = make_task(name, (200, 50, 50), seed=3), make_task(name, (200, 50, 50), seed=3)
    assert a == b and len(a.test.texts) == 50
    assert not set(a.train.texts) & set(a.test.texts)
    counts = [a.train.labels.count(k) for k in range(len(TASKS[name]))]
    assert min(counts) >= 0.6 * max(counts)


def test_unknown_task_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert veil_main(["finetune", "--task", "poetry"]) == 2
    assert "invalid choice: 'poetry'" in capsys.readouterr().err


@pytest.mark.parametrize("method", ["lora", "psoft"])
def test_tiny_run_writes_a_peft_adapter(method: str, tmp_path) -> None:
    """Issue 33.1: the documented PEFT path (``peft_base`` + ``PeftModel.from_pretrained``, the model called as a
    transformers classifier) gives veil's logits; the run's README names that path."""
    import peft
    import torch
    from veil.training.adapters import AdapterModel, peft_base
    from veil.training.adapters.finetune import build_classifier

    metrics = run(["--method", method, "--task", "number", "--out", str(tmp_path / "a"), *TINY])
    assert 0.0 <= metrics["test_accuracy"] <= 1.0 and metrics["history"][0]["epoch"] == 1
    folder = tmp_path / "a" if method == "lora" else tmp_path / "a" / "as_lora"
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["modules_to_save"] == ["classifier"]
    base, tokenizer = peft_base(folder)
    loaded = peft.PeftModel.from_pretrained(base, folder)  # the head comes back from modules_to_save
    batch = tokenizer(["there were seven cats in the yard.", "there were many cats."], padding=True,
                      return_tensors="pt")
    veil_model = AdapterModel.from_pretrained(build_classifier("bundled:all-MiniLM-L6-v2", 2, seed=1)[0].eval(), folder)
    with torch.no_grad():
        out = loaded(**batch, labels=torch.tensor([1, 0]))  # called as a transformers model, token_type_ids too
        expected = veil_model(batch["input_ids"], batch["attention_mask"])
    assert out.loss is not None and (out.logits - expected).abs().max() <= 1e-5
    readme = (tmp_path / "a" / "README.md").read_text()
    assert "peft_base(" in readme and "BertForSequenceClassification" in readme
    assert json.loads((tmp_path / "a" / "metrics.json").read_text())["method"] == method


def test_lora_pair_optimizer_trains_with_its_own_default_lr(tmp_path) -> None:
    metrics = run(["--method", "lora", "--optimizer", "adams", "--task", "number", "--out", str(tmp_path / "a"), *TINY])
    settings = json.loads((tmp_path / "a" / "finetune.json").read_text())
    assert settings["optimizer"] == "adams" and settings["lr"] == 3e-4  # OPTIMIZER_LR, not AdamW's 2e-3
    assert len(metrics["losses"]) >= 1 and metrics["optimizer_state_bytes"] > 0
    given = run(["--method", "lora", "--optimizer", "lracs", "--lr", "1e-4", "--optimizer-args",
                 '{"bias_correction": true}', "--task", "number", "--out", str(tmp_path / "b"), *TINY])
    assert json.loads((tmp_path / "b" / "finetune.json").read_text())["lr"] == 1e-4 and given["losses"]


@pytest.mark.slow
def test_lora_beats_the_linear_probe_on_sentiment(tmp_path) -> None:
    probe = run(["--method", "probe", "--task", "sentiment", "--lr", "1e-2", "--epochs", "3",
                 "--out", str(tmp_path / "p"), "--no-progress"])
    lora = run(["--method", "lora", "--task", "sentiment", "--out", str(tmp_path / "l"), "--no-progress"])
    assert lora["test_accuracy"] >= 0.9
    assert lora["test_accuracy"] >= probe["test_accuracy"] + 0.15


# -- every registered method ----------------------------------------------------------------------------------------
DIGITS_TINY = ["--task", "digits-5to9", "--pretrain-epochs", "1", "--epochs", "1", "--no-progress"]


def test_help_lists_every_method(capsys: pytest.CaptureFixture[str]) -> None:
    from veil.training.adapters import METHODS

    assert veil_main(["finetune", "--help"]) == 0
    out = capsys.readouterr().out
    assert all(m.value in out for m in METHODS) and "probe" in out and "digits-5to9" in out
    assert "--mtlora-num-experts" in out and "--config" in out


def test_e2lora_plans_then_writes_native_and_plain_lora(tmp_path) -> None:
    metrics = run(["--method", "e2lora", "--task", "number", "--out", str(tmp_path / "e"), *TINY])
    plan = metrics["share_intervals"]
    assert plan and all(len(iv) == 3 for ivs in plan.values() for iv in ivs)
    native = json.loads((tmp_path / "e" / "adapter_config.json").read_text())
    assert native["peft_type"] == "E2LORA" and native["share_intervals"] == plan
    assert "pooler.dense" not in str(plan)  # the mean-pool head never uses the pooler
    export = json.loads((tmp_path / "e" / "as_lora" / "adapter_config.json").read_text())
    assert export["peft_type"] == "LORA" and export["modules_to_save"] == ["classifier"]


@pytest.mark.parametrize(("extra", "targets"), [
    ([], ["intermediate"]),
    (["--mtlora-block-adapter-type", "both", "--mtlora-num-experts", "2"], ["intermediate", "attention"]),
])
def test_mtlora_wraps_bert_sub_layers(extra: list[str], targets: list[str], tmp_path) -> None:
    metrics = run(["--method", "mtlora", "--task", "number", "--out", str(tmp_path / "m"), *extra, *TINY])
    config = json.loads((tmp_path / "m" / "adapter_config.json").read_text())
    assert config["peft_type"] == "MTLORA" and config["target_modules"] == targets
    assert 0.0 <= metrics["test_accuracy"] <= 1.0 and "aux_loss" in metrics["history"][0]


def test_loramixer_maps_qkvo_to_bert_and_config_json_is_overridden_by_flags(tmp_path) -> None:
    run(["--method", "loramixer", "--task", "number", "--out", str(tmp_path / "x"),
         "--config", '{"num_experts": 2, "routing": "topk", "top_k": 1}', "--loramixer-num-experts", "3", *TINY])
    config = json.loads((tmp_path / "x" / "adapter_config.json").read_text())
    assert config["target_modules"] == ["query", "key", "value", "attention.output.dense"]
    assert (config["num_experts"], config["routing"], config["top_k"]) == (3, "topk", 1)


@pytest.mark.parametrize("method", ["vapt", "probe", "lora"])
def test_digits_workload_runs_on_the_tiny_vit(method: str, tmp_path) -> None:
    metrics = run(["--method", method, "--out", str(tmp_path / "d"), *DIGITS_TINY])
    assert metrics["labels"] == ["5", "6", "7", "8", "9"] and 0.0 <= metrics["test_accuracy"] <= 1.0
    assert "pretrain_accuracy_0_4" in metrics and (tmp_path / "d" / "base" / "config.json").exists()
    if method != "probe":
        config = json.loads((tmp_path / "d" / "adapter_config.json").read_text())
        assert config["peft_type"] == method.upper()
    if method == "vapt":
        assert metrics["trainable_params"] < 2000  # prompts + projector + head


def test_digits_pre_training_reports_progress(tmp_path, capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny ViT's pre-training (30 epochs by default, most of a digits run) printed nothing: 8 minutes of
    silence on a loaded machine in the issue 33 walk. In a log it is one plain line, never a \\r (transformers'
    "Writing model shards" bar of the base's save_pretrained wrote one)."""
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    argv = [a for a in DIGITS_TINY if a != "--no-progress"]
    run(["--method", "probe", "--out", str(tmp_path / "d"), *argv])
    err = capsys.readouterr().err
    assert "pre-train the tiny ViT on digits 0-4: done 1/1" in err and "\r" not in err
    run(["--method", "probe", "--out", str(tmp_path / "q"), *DIGITS_TINY])
    assert "pre-train" not in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "message"), [
    (["--method", "vapt", "--task", "sentiment"], "ViT-only"),
    (["--method", "unknown"], "invalid choice: 'unknown'"),
    (["--method", "mtlora", "--task", "digits-5to9"], "supports probe, lora, vapt"),
    (["--task", "digits-5to9", "--model", "bundled:all-MiniLM-L6-v2"], "expected --model vit-digits"),
    (["--method", "loramixer", "--config", "[1]"], "expected a JSON object"),
    (["--method", "psoft", "--optimizer", "adams"], "updates LoRA (A, B) pairs"),
    (["--method", "lora", "--task", "digits-5to9", "--model", "vit-digits", "--optimizer", "lracs"], "trains with adamw"),
])
def test_bad_combinations_are_clear_exit_2_errors(argv: list[str], message: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert veil_main(["finetune", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "usage: veil finetune --method METHOD" in err


@pytest.mark.slow
def test_vapt_beats_the_probe_on_digits_with_the_workload_defaults(tmp_path) -> None:
    probe = run(["--method", "probe", "--task", "digits-5to9", "--out", str(tmp_path / "p"), "--no-progress"])
    vapt = run(["--method", "vapt", "--task", "digits-5to9", "--vapt-num-tokens", "4", "--out", str(tmp_path / "v"),
                "--no-progress"])
    assert probe["pretrain_accuracy_0_4"] >= 0.9
    assert vapt["test_accuracy"] >= probe["test_accuracy"] + 0.05  # measured 75.5 % vs 65.8 %


def test_digits_settings_file_records_the_workload_defaults(tmp_path) -> None:
    run(["--method", "probe", "--out", str(tmp_path / "d"), *DIGITS_TINY])
    saved = json.loads((tmp_path / "d" / "finetune.json").read_text())
    assert (saved["lr"], saved["batch_size"], saved["epochs"], saved["task"]) == (1e-2, 64, 1, "digits-5to9")
