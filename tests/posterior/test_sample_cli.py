"""`veil sample` through main(argv): draws from an exported sampler under a prior given inline or in a file."""

from __future__ import annotations

import json

import numpy as np
import pytest
from veil.export.sampler import export_sampler
from veil.posterior.cli import main
from veil.training.priorguide import SamplerTrainConfig, ScoreNetConfig, get_task, save_sampler, train_score

PRIOR = {"family": "gaussian", "mean": [0.2, -0.1], "std": 0.06}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    task = get_task("gaussian_linear", 2)
    theta, x = task.simulate_pairs(1000, seed=0)
    result = train_score(theta, x, task.prior, ScoreNetConfig(dim=2, x_dim=2, hidden=32),
                         SamplerTrainConfig(simulations=1000, steps=100, batch_size=128), progress=False)
    root = tmp_path_factory.mktemp("cli")
    save_sampler(result, root / "ck", {"name": task.name, "dim": 2})
    export_sampler(root / "ck", root / "repo", "gl2")
    return root / "repo" / "gl2"


def test_sample_inline_prior_to_npy(model_dir, tmp_path, capsys) -> None:
    out = tmp_path / "draws.npy"
    assert main([str(model_dir), "--x", "0.1", "0.0", "--prior", json.dumps(PRIOR), "--num-samples", "200",
                 "--steps", "10", "--langevin-steps", "1", "--pilot", "50", "--out", str(out)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["samples"] == [200, 2] and report["diagnostics"]["nfe"] == 20
    assert np.load(out).shape == (200, 2)


def test_sample_prior_file_to_csv_and_unguided(model_dir, tmp_path, capsys) -> None:
    (tmp_path / "p.json").write_text(json.dumps(PRIOR))
    assert main([str(model_dir / "1"), "--x", "0.1", "0.0", "--prior-file", str(tmp_path / "p.json"),
                 "--num-samples", "30", "--steps", "5", "--out", str(tmp_path / "d.csv")]) == 0
    assert np.loadtxt(tmp_path / "d.csv", delimiter=",").shape == (30, 2)
    capsys.readouterr()
    assert main([str(model_dir), "--x", "0.1", "0.0", "--num-samples", "10", "--steps", "5"]) == 0
    assert "ood" not in json.loads(capsys.readouterr().out)["diagnostics"]


@pytest.mark.parametrize(("argv", "words"), [
    (["--x", "0.1", "0.0", "--prior", '{"family": "beta"}'], "prior.family"),
    (["--x", "0.1", "0.0", "--prior", json.dumps({**PRIOR, "mean": [0, 0, 0]})], "expected dimension 2"),
    (["--x", "0.1"], "x: expected 2 values"),
])
def test_sample_refusals_exit_2_with_the_reason(model_dir, capsys, argv, words) -> None:
    with pytest.raises(SystemExit) as info:
        main([str(model_dir), *argv, "--steps", "3"])
    assert info.value.code == 2 and words in capsys.readouterr().err


def test_help_shows_an_example(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0 and "veil sample models/gl5 --x" in capsys.readouterr().out
