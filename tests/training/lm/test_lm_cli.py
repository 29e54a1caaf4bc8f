"""`veil train lm` in-process: help, a tiny run that writes the checkpoint, --config, --text, refusals."""

from __future__ import annotations

import json

import pytest
from veil.training.lm.cli import main

from veil.cli import main as veil_main

TINY_RUN = ["--preset", "micro", "--steps", "6", "--batch-size", "4", "--block-size", "32", "--eval-every", "3",
            "--eval-blocks", "8", "--no-progress"]


def test_help_shows_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and "example:" in out and "veil train lm --optimizer" in out and "--text" in out


def test_cli_trains_writes_the_folder_and_reuses_its_config(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "lm"
    assert veil_main(["train", "lm", *TINY_RUN, "--seed", "3", "--out", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["checkpoint"] == str(out) and printed["optimizer"] == "adamw" and printed["parameters"] == 139_584
    assert {p.name for p in out.iterdir()} == {"config.json", "model.safetensors", "metrics.json"}
    saved = json.loads((out / "config.json").read_text())
    assert saved["train"]["steps"] == 6 and saved["train"]["seed"] == 3 and saved["model"]["hidden_size"] == 64
    assert saved["data"]["source"] == "bundled:pydoc_topics"

    again = tmp_path / "again"
    assert main(["--config", str(out / "config.json"), "--steps", "3", "--out", str(again), "--no-progress"]) == 0
    reused = json.loads((again / "config.json").read_text())
    assert reused["model"] == saved["model"] and reused["train"] == {**saved["train"], "steps": 3}


def test_cli_trains_on_own_text(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    text = tmp_path / "poem.txt"
    text.write_text("Roses are red, violets are blue; bytes are all a tiny model can chew.\n" * 100)
    assert main([*TINY_RUN, "--text", str(text), "--out", str(tmp_path / "poem")]) == 0
    capsys.readouterr()
    data = json.loads((tmp_path / "poem" / "config.json").read_text())["data"]
    assert data["source"] == "file:poem.txt" and data["documents"] == 20


def test_refused_optimizer_names_the_field(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    assert veil_main(["train", "lm", *TINY_RUN, "--optimizer", "lracs", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "LMTrainConfig.optimizer: expected one of [" in err and "received 'lracs'" in err
    assert not (tmp_path / "x").exists()
    assert veil_main(["train", "lm", *TINY_RUN, "--text", str(tmp_path / "nope.txt")]) == 2
    assert "--text: expected an existing file" in capsys.readouterr().err


def test_optimizer_args_reach_the_optimizer(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*TINY_RUN, "--optimizer", "alice", "--optimizer-args", '{"rank": 4, "alpha_c": 0.0}',
                 "--out", str(tmp_path / "a")]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["optimizer_kwargs"] == {"weight_decay": 0.0, "rank": 4, "leading": 1, "alpha_c": 0.0,
                                           "update_interval": 1}
    assert printed["lr"] == 0.02
    saved = json.loads((tmp_path / "a" / "config.json").read_text())["train"]
    assert saved["optimizer_args"] == {"rank": 4, "alpha_c": 0.0} and saved["lr"] is None
