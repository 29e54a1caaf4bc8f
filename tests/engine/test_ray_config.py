"""Ray Serve settings without a cluster: replicas from config.pbtxt or flags, autoscaling, flag errors, summed stats."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("ray.serve")

from veil.engine import ray_config, ray_plane
from veil.engine.cli import ray_config_from_args
from veil.engine.server import ServerConfig
from veil.engine.toy import affine_model, write_repository

from veil.config import ConfigError


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = write_repository(tmp_path / "repo", {"one": affine_model(), "three": affine_model()})
    config = repo / "three" / "config.pbtxt"
    config.write_text(config.read_text().replace("count: 1", "count: 3"))
    return repo


def test_replicas_come_from_instance_group_unless_given(repo: Path):
    default = ray_config.RayConfig()
    assert ray_config.deployment_options(repo, "one", default)["num_replicas"] == 1
    assert ray_config.deployment_options(repo, "three", default)["num_replicas"] == 3
    assert ray_config.deployment_options(repo, "three", ray_config.RayConfig(replicas=2))["num_replicas"] == 2
    auto = ray_config.deployment_options(repo, "one", ray_config.RayConfig(min_replicas=1, max_replicas=4))
    assert "num_replicas" not in auto and auto["autoscaling_config"]["max_replicas"] == 4


def test_replicas_get_absolute_paths_and_one_thread_per_cpu(repo: Path, monkeypatch):
    monkeypatch.chdir(repo.parent)
    config = ray_config.replica_config(ServerConfig(repo="repo"), ray_config.RayConfig(replica_cpus=1.5))
    assert config.repo == str(repo.resolve()) and config.he_key_dir == str(repo.resolve() / ".he-keys")
    assert config.intra_op_threads == 2


@pytest.mark.parametrize(("argv", "message"), [
    (["--replicas", "2", "--max-replicas", "3"], "either --replicas"),
    (["--min-replicas", "5", "--max-replicas", "3"], "min_replicas"),
    (["--replica-cpus", "0"], "replica_cpus > 0"),
])
def test_bad_ray_flags_name_the_field(argv: list[str], message: str):
    with pytest.raises(ConfigError, match=message):
        ray_config_from_args(["--repo", "x", "--ray", *argv])
    assert ray_config_from_args(["--repo", "x", *argv]) is None  # without --ray the flags do nothing


def _row(count: int) -> dict:
    stats = {k: {"count": count, "ns": 10 * count} for k in ("success", "fail", "queue", "compute_input",
                                                             "compute_infer", "compute_output")}
    return {"name": "m", "version": "1", "last_inference": count, "inference_count": count,
            "execution_count": count, "inference_stats": stats, "batch_stats": []}


def test_stats_are_summed_over_replicas_with_each_listed():
    board = ray_plane.Board()
    board.reports = {}
    board.report("r1", "m", 11, [_row(2)])
    board.report("r2", "m", 12, [_row(5)])
    board.report("r3", "other", 13, [{**_row(7), "name": "other"}])
    (entry,) = board.stats("m")
    assert entry["inference_count"] == 7 and entry["inference_stats"]["success"] == {"count": 7, "ns": 70}
    assert [(r["replica"], r["pid"], r["success_count"]) for r in entry["replicas"]] == [("r1", 11, 2), ("r2", 12, 5)]
    assert board.stats("m:adapter") == board.stats("m") and board.stats("m", "2") == []
    assert len(board.stats()) == 2


def test_replicas_beyond_the_clusters_cpus_fail_fast(tmp_path: Path, monkeypatch, capsys):
    """Issue 31 item 12: `--replicas 2` over 5 models on 2 CPUs printed nothing for 13 minutes while Ray waited for
    CPUs that never came; the CPUs the replicas reserve are checked against the cluster's before deploying."""
    five = write_repository(tmp_path / "five", {f"m{i}": affine_model() for i in range(5)})
    with pytest.raises(ConfigError, match=r"the replicas reserve 10 CPUs \(m0 2, m1 2, m2 2, m3 2, m4 2\), expected at "
                                          r"most the cluster's 2; lower --replicas .*--replica-cpus"):
        ray_config.check_cluster_cpus(five, ray_config.RayConfig(replicas=2), 2.0)
    ray_config.check_cluster_cpus(five, ray_config.RayConfig(replicas=1, replica_cpus=0.4), 2.0)  # 2.0 fits
    auto = ray_config.RayConfig(min_replicas=1, max_replicas=8, replica_cpus=0.5)
    assert ray_config.required_cpus(five, auto) == {f"m{i}": 0.5 for i in range(5)}

    import ray

    started: list[str] = []  # nothing is deployed: serve.start is never reached
    monkeypatch.setattr(ray, "init", lambda **kwargs: None)
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0})
    monkeypatch.setattr(ray_plane.serve, "start", lambda **kwargs: started.append("start"))
    from veil.engine.cli import main

    assert main(["--repo", str(five), "--ray", "--replicas", "2", "--port", "0"]) == 2
    assert started == [] and "--replica-cpus" in capsys.readouterr().err
