"""`veil cluster` and `veil games solve|cfr` in-process: JSON on stdout, exit 2 with one line for bad input,
an example in every --help."""

from __future__ import annotations

import json

import numpy as np
import pytest

from veil.cli import main


@pytest.mark.parametrize("argv", [["cluster", "--help"], ["games", "solve", "--help"], ["games", "cfr", "--help"]])
def test_every_help_has_an_example(argv: list[str], capsys) -> None:
    assert main(argv) == 0
    assert "example:\n  veil " in capsys.readouterr().out.replace("  python -c", "  veil")


def test_veil_cluster_writes_a_summary_and_per_item_assignments(tmp_path, blobs, capsys) -> None:
    data = tmp_path / "pts.jsonl"
    data.write_text("".join(json.dumps({"id": f"p{i}", "x": x}) + "\n" for i, x in enumerate(blobs[:150].tolist())))
    out = tmp_path / "labels.jsonl"
    argv = ["cluster", "--data", str(data), "--k", "3", "--oracle", "noisy", "--phi", "0.1", "--out", str(out)]
    assert main(argv) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert captured.err.startswith("round 1: 150 points left, 0 queries so far\n")  # progress on stderr
    assert summary["n"] == 150 and summary["queries"] > 0 and sum(summary["cluster_sizes"]) == 150
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == [f"p{i}" for i in range(150)] and {r["cluster"] for r in rows} <= {0, 1, 2}


def test_veil_cluster_through_a_model_oracle(tmp_path, blobs, server_url, capsys) -> None:
    data = tmp_path / "pts.jsonl"
    data.write_text("".join(json.dumps({"x": x}) + "\n" for x in blobs[:90].tolist()))
    argv = ["cluster", "--data", str(data), "--k", "3", "--oracle", "model", "--server", server_url, "--model", "emb"]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["oracle"] == "model" and summary["n"] == 90 and summary["queries"] > 0
    assert main([*argv[:-1], "missing"]) == 2
    assert "HTTP 404" in capsys.readouterr().err


def test_veil_cluster_refuses_texts_without_the_model_oracle(tmp_path, capsys) -> None:
    data = tmp_path / "t.jsonl"
    data.write_text('{"text": "a"}\n{"text": "b"}\n')
    assert main(["cluster", "--data", str(data), "--k", "1", "--oracle", "exact"]) == 2
    assert 'expected items with "x", received texts' in capsys.readouterr().err


def test_veil_games_solve_prints_the_gap_curve_and_plots_it(tmp_path, capsys) -> None:
    payoff = tmp_path / "a.npy"
    np.save(payoff, np.array([[3.0, 0, -3], [0, 3, -4], [0, 0, 1]]))
    plot = tmp_path / "gap.png"
    argv = ["games", "solve", str(payoff), "--algorithm", "mi-sprm+", "--iterations", "500", "--plot", str(plot)]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["iterations"][-1] == 500 and report["gaps"][-1] == report["gap"] < report["gaps"][0]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_veil_games_solve_refuses_a_bad_payoff_file(tmp_path, capsys) -> None:
    bad = tmp_path / "a.csv"
    bad.write_text("1,2\n3\n")
    assert main(["games", "solve", str(bad)]) == 2
    assert "payoff: expected rows of equal length, received [1, 2]" in capsys.readouterr().err


def test_veil_games_cfr_on_kuhn_poker(capsys) -> None:
    pytest.importorskip("pyspiel")
    assert main(["games", "cfr", "kuhn_poker", "--iterations", "30"]) == 0
    run = json.loads(capsys.readouterr().out)
    assert run["exploitability"][-1] < 0.2 * run["exploitability"][0]


@pytest.mark.parametrize(("argv", "needle"), [
    (["games", "solve", "{deep}"], "payoff: expected a JSON list of rows (lists of numbers), received 'JSON nested too deep"),
    (["games", "solve", "{dir}"], "payoff file: expected a file, received 'the directory"),
    (["cluster", "--data", "{dir}", "--k", "2"], "data: expected a UTF-8 JSONL file, received 'the directory"),
    (["cluster", "--data", "{deepl}", "--k", "2"], "line 1: expected a JSON object"),
])
def test_hostile_inputs_are_one_line_errors(tmp_path, capsys, argv: list[str], needle: str) -> None:
    """Issue 31 item 16: 100 k-deep nested JSON for `veil games solve` and a directory for `veil cluster --data`
    were raw tracebacks; now one line on stderr, exit 2."""
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (tmp_path / "deep.jsonl").write_text("[" * 100_000 + "]" * 100_000 + "\n")
    (tmp_path / "folder.json").mkdir()
    paths = {"{deep}": tmp_path / "deep.json", "{dir}": tmp_path / "folder.json", "{deepl}": tmp_path / "deep.jsonl"}
    assert main([str(paths.get(a, a)) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and needle in err, err
