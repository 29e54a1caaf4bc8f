"""`veil serve` says where it listens once ready: one line with the HTTP, gRPC and metrics addresses (issue 33.4)."""

from __future__ import annotations

from pathlib import Path


def test_serve_prints_one_ready_line_with_every_address(repo: Path, oip) -> None:
    import httpx

    with oip.server_process(repo) as server:
        process, url, grpc = server.process, server.url, server.grpc
        assert httpx.get(f"http://{url}/metrics", timeout=5).status_code == 200  # the address printed answers
    err = process.stderr.read().decode()
    ready = [line for line in err.splitlines() if line.startswith("veil serve: ready: ")]
    assert len(ready) == 1, err
    assert f"HTTP http://{url}/v2, gRPC {grpc}, metrics http://{url}/metrics; 3 model(s): affine, batched, dtypes" \
        in ready[0]


def test_ready_line_without_grpc_names_the_flag() -> None:
    from veil.engine.server import ServerConfig, ready_line

    line = ready_line(ServerConfig(repo="models", host="::1", port=8000), ["digits"], None)
    assert line == ("veil serve: ready: HTTP http://[::1]:8000/v2, gRPC off (--grpc-port P), "
                    "metrics http://[::1]:8000/metrics; 1 model(s): digits")
