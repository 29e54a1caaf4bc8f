"""`veil export sampler`: the torch.export score program matches the eager network, outputs and gradients."""

from __future__ import annotations

import json

import pytest
import torch
from veil.engine.pbtxt import parse
from veil.export.errors import ExportError
from veil.export.sampler import export_sampler
from veil.export.sampler_cli import main
from veil.posterior.artifact import load_artifact
from veil.posterior.priors import Gaussian
from veil.training.priorguide import (
    SamplerTrainConfig,
    ScoreNetConfig,
    get_task,
    load_sampler,
    save_sampler,
    train_score,
)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    task = get_task("gaussian_linear", 3)
    theta, x = task.simulate_pairs(1000, seed=0)
    result = train_score(theta, x, task.prior, ScoreNetConfig(dim=3, x_dim=3, hidden=32),
                         SamplerTrainConfig(simulations=1000, steps=100, batch_size=128), progress=False)
    path = tmp_path_factory.mktemp("sampler") / "ck"
    save_sampler(result, path, {"name": task.name, "dim": 3})
    return path


def test_export_writes_the_repository_entry(checkpoint, tmp_path) -> None:
    manifest = export_sampler(checkpoint, tmp_path / "repo", "gl3")
    model_dir = tmp_path / "repo" / "gl3"
    config = parse((model_dir / "config.pbtxt").read_text())
    assert config["backend"] == "veil_sampler" and config["default_model_filename"] == "sampler.json"
    spec = json.loads((model_dir / "1" / "sampler.json").read_text())
    assert spec["dim"] == 3 and spec["n_train"] == 1000 and spec["sde"]["type"] == "ve"
    assert spec["train_prior"]["family"] == "gaussian" and (model_dir / "1" / "score.pt2").is_file()
    report = manifest["export"]["validation"]
    assert report["max_rel_error_output"] <= 1e-4 and report["max_rel_error_vjp"] <= 1e-4
    assert json.loads((model_dir / "veil.json").read_text())["source"]["sha256"] == manifest["source"]["sha256"]


def test_program_matches_eager_with_gradients_at_new_batch_sizes(checkpoint, tmp_path) -> None:
    export_sampler(checkpoint, tmp_path / "repo", "gl3")
    program = load_artifact(tmp_path / "repo" / "gl3" / "1").posterior.score.fn
    model, _, _ = load_sampler(checkpoint)
    for n in (2, 1000):
        theta = torch.randn(n, 3, requires_grad=True)
        sigma, x = torch.logspace(-4, 1.1, n), torch.randn(n, 3)
        a, b = program(theta, sigma, x), model(theta, sigma, x)
        (ga,) = torch.autograd.grad(a.pow(2).sum(), theta)
        (gb,) = torch.autograd.grad(b.pow(2).sum(), theta)
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-5) and torch.allclose(ga, gb, rtol=1e-4, atol=1e-4)


def test_exported_and_eager_posteriors_draw_the_same_samples(checkpoint, tmp_path) -> None:
    from veil.training.priorguide import load_posterior

    export_sampler(checkpoint, tmp_path / "repo", "gl3")
    served = load_artifact(tmp_path / "repo" / "gl3").posterior
    q = Gaussian.diag([0.1, 0.0, -0.1], [0.1, 0.1, 0.1])
    kw = {"x": torch.tensor([0.1, 0.2, 0.0]), "prior": q, "steps": 10, "langevin_steps": 2, "pilot": 50}
    a, b = served.sample((200,), **kw).theta, load_posterior(checkpoint).sample((200,), **kw).theta
    assert torch.allclose(a, b, atol=1e-4)


def test_export_cli_and_refusals(checkpoint, tmp_path, capsys) -> None:
    assert main([str(checkpoint), "--repo", str(tmp_path / "repo"), "--name", "gl3", "--steps", "40"]) == 0
    assert json.loads(capsys.readouterr().out)["dim"] == 3
    assert json.loads((tmp_path / "repo" / "gl3" / "1" / "sampler.json").read_text())["defaults"]["steps"] == 40
    with pytest.raises(ExportError, match="--name"):
        export_sampler(checkpoint, tmp_path / "repo", "bad name")
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0 and "veil export sampler runs/" in capsys.readouterr().out


def test_predictive_model_exports_and_serves_x_star(tmp_path) -> None:
    from veil.training.priorguide.cli import main as train_main

    assert train_main(["--task", "gaussian_linear", "--dim", "2", "--predictive", "--steps", "30",
                       "--simulations", "500", "--hidden", "16", "--out", str(tmp_path / "ck"), "--no-progress"]) == 0
    export_sampler(tmp_path / "ck", tmp_path / "repo", "pred")
    config = parse((tmp_path / "repo" / "pred" / "config.pbtxt").read_text())
    assert [o["name"] for o in config["output"]] == ["samples", "diagnostics", "predictive"]
    artifact = load_artifact(tmp_path / "repo" / "pred")
    assert artifact.spec["dim"] == 4 and artifact.spec["theta_dim"] == 2
    out = artifact.posterior.sample((30,), x=torch.zeros(2), prior=Gaussian.diag([0.1, 0.0], [0.1, 0.1]), steps=5,
                                    langevin_steps=1, pilot=20)
    assert out.theta.shape == (30, 2) and out.predictive.shape == (30, 2)


def test_a_failed_export_publishes_no_half_model(checkpoint, tmp_path, monkeypatch) -> None:
    # issue 19 item 14: the version folder used to be visible before config.pbtxt and veil.json
    from veil.export import sampler as export_sampler_module

    real = export_sampler_module.write_atomic

    def fail_on_config(path, data, *args, **kwargs):
        if str(path).endswith("config.pbtxt"):
            raise OSError("killed before config.pbtxt")
        return real(path, data, *args, **kwargs)

    monkeypatch.setattr(export_sampler_module, "write_atomic", fail_on_config)
    with pytest.raises(OSError, match="killed"):
        export_sampler_module.export_sampler(checkpoint, tmp_path / "repo", "sampler")
    assert not (tmp_path / "repo" / "sampler").exists()
