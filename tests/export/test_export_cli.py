"""Issue 24: the export verbs share one parent parser, and `veil export onnx` dispatches on the recorded kind."""

from __future__ import annotations

import json

import pytest

from veil.cli import GROUPS, main


def _onnx(tmp_path, source: str, capsys) -> tuple[int, str]:
    status = main(["export", "onnx", source, "--repo", str(tmp_path / "repo")])
    return status, capsys.readouterr().err


def test_a_missing_path_is_reported_as_not_found(tmp_path, capsys) -> None:
    status, err = _onnx(tmp_path, str(tmp_path / "runs" / "polycnnn"), capsys)
    assert status == 2 and "polycnnn" in err and "not found" in err
    assert not (tmp_path / "repo").exists()


@pytest.mark.parametrize(("kind", "verb"), [("codec", "veil export codec"), ("priorguide-sampler", "veil export sampler"),
                                           ("forecast", "veil export forecast")])
def test_a_kind_another_verb_exports_names_that_verb(tmp_path, capsys, kind: str, verb: str) -> None:
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "config.json").write_text(json.dumps({"kind": kind}))
    status, err = _onnx(tmp_path, str(tmp_path / "ck"), capsys)
    assert status == 2 and f"a {kind!r} checkpoint is exported by `{verb} {tmp_path / 'ck'}" in err
    assert "model_type" not in err  # what transformers said when every non-ULD-Net folder was an encoder


def test_an_unknown_kind_lists_the_known_ones(tmp_path, capsys) -> None:
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "config.json").write_text(json.dumps({"kind": "moe_pruned"}))
    status, err = _onnx(tmp_path, str(tmp_path / "ck"), capsys)
    assert status == 2 and "kind: expected one of ['codec', 'finetune', 'forecast', 'huggingface-encoder', " in err
    assert "received 'moe_pruned'" in err
    (tmp_path / "ck" / "config.json").unlink()
    status, err = _onnx(tmp_path, str(tmp_path / "ck"), capsys)
    assert status == 2 and "expected a folder with config.json" in err


def test_every_export_verb_shares_the_repository_options(capsys) -> None:
    """--repo/--name/--version come from one parent parser: same help, same --version check in every verb."""
    for verb in GROUPS["export"][1]:
        assert main(["export", verb, "--help"]) == 0
        out = capsys.readouterr().out
        assert "model repository:" in out and "version folder to write (default: 1)" in out, verb
        assert main(["export", verb, "src", "--repo", "r", "--name", "n", "--version", "0"]) == 2
        assert "--version: expected an integer >= 1 (the version folder), received '0'" in capsys.readouterr().err, verb
