"""The `veil` command: groups, help with examples, version, errors, a real training run in-process."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from veil import __version__
from veil.cli import GROUPS, main


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"veil {__version__}"


def test_top_level_help_lists_every_group_and_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for group in [*GROUPS, "demo"]:
        assert f"  {group}" in out
    assert "example:" in out


@pytest.mark.parametrize("group", list(GROUPS))
def test_every_group_has_help_with_an_example(group: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([group, "--help"]) == 0
    out = capsys.readouterr().out
    assert f"veil {group}" in out and "example:" in out


def test_bare_veil_and_a_bare_group_print_help_and_succeed(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 32: bare `veil` printed its usage and exited 2; like bare `pip`, it is a request for help."""
    assert main([]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("usage: veil <group> <verb>") and "example:" in captured.out and not captured.err
    assert main(["train"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("usage: veil train <verb>") and not captured.err


def test_unknown_group_and_verb_are_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["nope"]) == 2
    assert "unknown group 'nope'" in capsys.readouterr().err
    assert main(["train", "nope"]) == 2
    assert f"unknown verb 'nope'; expected {sorted(GROUPS['train'][1])}" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [[group, verb] for group, (_, verbs, _) in GROUPS.items() for verb in verbs if verb]
                         + [["demo"]])
def test_every_verb_has_help_with_an_example_and_returns_0(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*argv, "--help"]) == 0
    assert "example:" in capsys.readouterr().out.lower()


def _sub_verbs() -> list[list[str]]:
    """The verbs inside one-command groups (`veil codec encode`, `veil he keygen`), from their own parsers."""
    import argparse
    import importlib

    found = []
    for group, (_, verbs, _) in GROUPS.items():
        module = importlib.import_module(verbs[""]) if "" in verbs else None
        if module is None:
            continue
        if hasattr(module, "VERBS"):
            found += [[group, verb] for verb in module.VERBS]
            continue
        try:
            parser = module.build_parser()
        except TypeError:
            continue
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                found += [[group, verb] for verb in action.choices]
    return found


@pytest.mark.parametrize("argv", _sub_verbs())
def test_every_verb_of_a_one_command_group_has_an_example(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """docs/cli.md promises an example on every verb; `veil codec VERB --help` had none (issue 33.4)."""
    assert main([*argv, "--help"]) == 0
    assert "example:" in capsys.readouterr().out.lower()


def test_codec_verbs_are_checked() -> None:
    assert {("codec", v) for v in ("encode", "decode", "truncate", "eval", "bench", "plot")} <= {
        tuple(a) for a in _sub_verbs()}


def test_usage_error_returns_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "uldnet", "--no-such-flag"]) == 2
    assert "unrecognized arguments: --no-such-flag" in capsys.readouterr().err


def test_bad_config_value_is_one_clear_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "uldnet", "--epochs", "3", "--no-progress"]) == 2  # warm-up 5 >= epochs 3
    err = capsys.readouterr().err
    assert "--warmup-epochs: expected 0 <= --warmup-epochs < --epochs=3, received 5; lower --warmup-epochs" in err
    assert "Traceback" not in err


def test_train_uldnet_writes_checkpoint_and_prints_metrics(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ck"
    argv = ["train", "uldnet", "--arch", "mlp", "--width", "32", "--epochs", "2", "--warmup-epochs", "1",
            "--act-degree", "3", "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["polynomial"] and metrics["depth_total"] == 2 * (1 + 3 + 2) + 1  # digits preset: 2 hidden layers
    assert {p.name for p in out.iterdir()} == {"config.json", "model.safetensors", "metrics.json"}
    saved = json.loads((out / "config.json").read_text())
    assert saved["kind"] == "uldnet" and saved["model"]["act"]["degree"] == 3 and saved["train"]["epochs"] == 2
    # the saved config.json drives a second run; flags still override it
    assert main(["train", "uldnet", "--config", str(out / "config.json"), "--epochs", "3", "--out",
                 str(tmp_path / "ck2"), "--no-progress"]) == 0
    again = json.loads((tmp_path / "ck2" / "config.json").read_text())
    assert again["model"] == saved["model"] and again["train"]["epochs"] == 3


def test_console_script_entry_point_runs() -> None:
    done = subprocess.run([sys.executable, "-m", "veil.cli", "--version"], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == f"veil {__version__}"
