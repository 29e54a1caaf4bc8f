"""`veil train rl`: the toy task and a user's own LM checkpoint, prompts file and reward rule."""

from __future__ import annotations

import json

import pytest

from veil.cli import main

TOY = ["--toy-num-symbols", "6", "--toy-length", "3", "--toy-hidden-size", "32", "--toy-layers", "1",
       "--toy-warm-steps", "20", "--toy-warm-batch", "16", "--prompts-per-step", "4", "--no-progress"]


def test_toy_lopti_run_writes_checkpoint_with_reward_curve(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "rl", "--method", "lopti", "--steps", "3", *TOY, "--out", str(tmp_path / "rl")]) == 0
    printed = json.loads(capsys.readouterr().out)
    metrics = json.loads((tmp_path / "rl" / "metrics.json").read_text())
    config = json.loads((tmp_path / "rl" / "config.json").read_text())
    assert printed["optimizer_steps"] == 6.0  # Lopti: two passes per RL step
    assert [h["step"] for h in metrics["history"]] == [1, 2, 3]
    assert all(0.0 <= h["reward_mean"] <= 1.0 for h in metrics["history"])
    assert config["grpo"]["lopti"] is True and config["grpo"]["max_new_tokens"] == 4 and config["reward"] == "sort"
    assert (tmp_path / "rl" / "model.safetensors").stat().st_size > 10_000


def test_flags_override_the_preset(tmp_path) -> None:
    assert main(["train", "rl", "--method", "ar", "--ar-alpha", "0.5", "--group-size", "4", "--steps", "1", *TOY,
                 "--out", str(tmp_path / "rl")]) == 0
    grpo = json.loads((tmp_path / "rl" / "config.json").read_text())["grpo"]
    assert grpo["ar"] is True and grpo["ar_alpha"] == 0.5 and grpo["group_size"] == 4 and grpo["lr"] == 3e-4


def test_own_lm_prompts_and_reward_module_on_lora(tmp_path) -> None:
    (tmp_path / "rules.py").write_text(
        "from veil.training.rl import register_reward\n\n"
        "@register_reward('count_e_cli_test')\n"
        "def count_e(prompt_ids, completion_ids):\n"
        "    return completion_ids.count(ord('e')) / max(1, len(completion_ids))\n")
    (tmp_path / "prompts.txt").write_text("def f(x):\n\nimport os\n")
    assert main(["train", "lm", "--preset", "micro", "--steps", "5", "--no-progress", "--out", str(tmp_path / "lm")]) == 0
    assert main(["train", "rl", "--model", str(tmp_path / "lm"), "--prompts", str(tmp_path / "prompts.txt"),
                 "--reward-module", str(tmp_path / "rules.py"), "--reward", "count_e_cli_test", "--lora-r", "4",
                 "--steps", "2", "--max-new-tokens", "6", "--lr", "1e-3", "--no-progress",
                 "--out", str(tmp_path / "rl")]) == 0
    config = json.loads((tmp_path / "rl" / "config.json").read_text())
    assert config["source"]["num_prompts"] == 2 and config["lora_r"] == 4 and config["grpo"]["max_new_tokens"] == 6


def test_bad_input_is_one_clear_line(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "rl", "--reward", "no_such_rule", *TOY, "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "reward: expected one of" in err and "'no_such_rule'" in err
    assert main(["train", "rl", "--model", str(tmp_path), "--prompts", str(tmp_path / "none.txt"), "--reward", "sort",
                 "--out", str(tmp_path / "x")]) == 2
    assert "--prompts: expected a text file" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
