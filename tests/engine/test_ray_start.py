"""`veil serve --ray` starting and stopping without a cluster (issue 31 item 12): ray.init, serve.start/run_many/
status/delete stubbed with Ray's own status classes, so a deployment that never becomes healthy, a readiness probe
while replicas are pending and a signal during the deploy are each checked in a second."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

pytest.importorskip("ray.serve")

from ray.serve._private.common import DeploymentStatusTrigger
from ray.serve.schema import ApplicationStatusOverview, DeploymentStatusOverview, ServeStatus
from veil.engine import http, ray_plane, ray_serve
from veil.engine.cli import main
from veil.engine.server_config import ServerConfig
from veil.engine.toy import affine_model, write_repository

pytestmark = pytest.mark.timeout(30)
PENDING = ("Deployment 'VeilModel' in application 'veil-m1' has 1 replicas that have taken more than 30s to be "
           "scheduled. This may be due to waiting for the cluster to auto-scale or for a runtime environment to be "
           "installed.\nResources required for each replica: {\"CPU\": 1.0}, total resources available: {}.")


def _app(status: str, deployment: str = "HEALTHY", running: int = 1, message: str = "") -> ApplicationStatusOverview:
    d = DeploymentStatusOverview(status=deployment, status_trigger=DeploymentStatusTrigger.UNSPECIFIED,
                                 replica_states={"RUNNING": running} if running else {"STARTING": 1}, message=message)
    return ApplicationStatusOverview(status=status, message="", last_deployed_time_s=0.0,
                                     deployments={"VeilModel": d})


def _status(models: dict[str, ApplicationStatusOverview]) -> ServeStatus:
    return ServeStatus(applications={"veil": _app("RUNNING"), **{f"veil-{m}": a for m, a in models.items()}})


class FakeServe:
    """ray.init .. ray.shutdown and the serve calls `serve_ray` makes, recorded; `status` is what serve.status()
    answers (``polled`` is set once it was asked while deploying)."""

    def __init__(self, monkeypatch, status: ServeStatus) -> None:
        import ray

        self.status, self.calls, self.polled = status, [], threading.Event()
        self.deleted: list[str] = []

        def init(**kwargs: Any) -> None:  # Ray's driver turns SIGTERM into sys.exit (ray._private.worker.init)
            signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(signum))
            self.calls.append("init")

        def run_many(targets: list, wait_for_applications_running: bool = True, **kwargs: Any) -> None:
            self.calls.append("run_many")
            while wait_for_applications_running and any(a.status != "RUNNING"
                                                        for a in self.status.applications.values()):
                self.polled.set()  # Ray's own wait: forever while a replica cannot be scheduled
                threading.Event().wait(0.05)

        def status_now() -> ServeStatus:
            self.polled.set()
            return self.status

        def delete(name: str, _blocking: bool = True) -> None:
            self.deleted.append(name)
            self.status = ServeStatus(applications={k: v for k, v in self.status.applications.items() if k != name})

        class Handle:
            class grpc_port:  # serve.get_app_handle(FRONT_APP).grpc_port.remote().result()
                @staticmethod
                def remote() -> Any:
                    return type("R", (), {"result": lambda self: None})()

        monkeypatch.setattr(ray, "init", init)
        monkeypatch.setattr(ray, "shutdown", lambda: self.calls.append("shutdown"))
        monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 8.0})
        monkeypatch.setattr(ray_serve.serve, "start", lambda **kwargs: self.calls.append("start"))
        monkeypatch.setattr(ray_serve.serve, "run_many", run_many)
        monkeypatch.setattr(ray_serve.serve, "status", status_now)
        monkeypatch.setattr(ray_serve.serve, "delete", delete)
        monkeypatch.setattr(ray_serve.serve, "get_app_handle", lambda name: Handle())
        monkeypatch.setattr(ray_serve, "DEPLOY_POLL_S", 0.05, raising=False)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return write_repository(tmp_path / "repo", {"m0": affine_model(), "m1": affine_model()})


@pytest.fixture(autouse=True)
def _signals():
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def _run(argv: list[str]) -> int:
    """main(), with a signal's SystemExit / KeyboardInterrupt turned into a test failure."""
    try:
        return main(argv)
    except (KeyboardInterrupt, SystemExit) as exc:
        pytest.fail(f"veil serve --ray was interrupted by the signal instead of stopping cleanly: {exc!r}")


def test_a_deployment_that_never_runs_times_out_with_rays_reason(repo: Path, monkeypatch, capsys):
    """A replica Ray cannot schedule: before, `serve.run_many` waited forever and printed nothing; now the deploy
    stops after --ray-deploy-timeout, the applications are deleted and the one line gives Ray's reason."""
    fake = FakeServe(monkeypatch, _status({"m0": _app("RUNNING"),
                                           "m1": _app("DEPLOYING", "UPDATING", running=0, message=PENDING)}))
    assert _run(["--repo", str(repo), "--ray", "--port", "0", "--ray-deploy-timeout", "0.3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "not running after 0.3 s (--ray-deploy-timeout)" in err and "veil-m1 DEPLOYING" in err
    assert "taken more than 30s to be scheduled" in err and "Resources required for each replica" in err
    assert "veil-m0" not in err and "\n" not in err
    assert set(fake.deleted) == {"veil", "veil-m0", "veil-m1"} and fake.deleted[-1] == "veil"
    assert fake.calls[-1] == "shutdown"


def test_a_failed_deploy_exits_at_once(repo: Path, monkeypatch, capsys):
    FakeServe(monkeypatch, _status({"m0": _app("RUNNING"), "m1": _app(
        "DEPLOY_FAILED", "DEPLOY_FAILED", running=0, message="The deployment failed to start 3 times in a row. "
        "This may be due to a problem with its constructor: onnxruntime could not load model.onnx")}))
    assert _run(["--repo", str(repo), "--ray", "--port", "0"]) == 2  # default timeout 300 s: not waited for
    err = capsys.readouterr().err
    assert "the deploy failed: veil-m1 DEPLOY_FAILED" in err and "could not load model.onnx" in err


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_the_first_signal_while_deploying_stops_cleanly(sig: int, repo: Path, monkeypatch, capsys):
    """Before, two SIGINTs were ignored while Ray waited and SIGTERM aborted; the first one now stops the deploy,
    deletes what was deployed, shuts Ray down and exits 0, with the caller's handlers restored."""
    fake = FakeServe(monkeypatch, _status({"m0": _app("DEPLOYING", "UPDATING", running=0, message=PENDING),
                                           "m1": _app("RUNNING")}))
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    timer = threading.Thread(target=lambda: fake.polled.wait(20) and os.kill(os.getpid(), sig), daemon=True)
    timer.start()
    assert _run(["--repo", str(repo), "--ray", "--port", "0"]) == 0
    timer.join(5)
    assert "veil-m0" in fake.deleted and fake.calls[-1] == "shutdown"
    assert signal.getsignal(signal.SIGINT) is before[signal.SIGINT]
    assert "models on http" not in capsys.readouterr().out


class _Never:
    """A handle whose ``ready.remote()`` never resolves: a request queued for a replica that never starts."""

    class ready:
        @staticmethod
        def remote() -> Any:
            return asyncio.get_running_loop().create_future()


def _plane(repo: Path) -> Any:
    """The front's data plane over ``repo`` with every model's handle replaced by :class:`_Never`."""
    plane = ray_plane.RayPlane(ServerConfig(repo=str(repo)), ray_plane.RayConfig(), ray_plane.Board())
    plane.model_handle = lambda name, adapter="": _Never()
    return plane


def test_ready_answers_503_while_replicas_are_pending(repo: Path, monkeypatch):
    """Before, /v2/health/ready asked each model's handle and hung while Ray waited for CPUs."""
    status = _status({"m0": _app("DEPLOYING", "UPDATING", running=0, message=PENDING), "m1": _app("RUNNING")})
    monkeypatch.setattr(ray_serve.serve, "status", lambda: status)
    monkeypatch.setattr(ray_plane, "READY_PROBE_S", 0.2)
    request = SimpleNamespace(app=SimpleNamespace(state=SimpleNamespace(dataplane=_plane(repo))))

    async def probe() -> tuple[Any, Any]:
        return (await asyncio.wait_for(http.ready(request), 10), await asyncio.wait_for(http.live(request), 10))

    ready, live = asyncio.run(probe())
    # m0 has no running replica (not asked); m1's running replica did not answer within READY_PROBE_S
    assert ready.status_code == 503 and orjson.loads(ready.body) == {"ready": False, "models": {"m0": False,
                                                                                                  "m1": False}}
    assert live.status_code == 200
