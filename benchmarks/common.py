"""Shared by the benchmark scripts: replace (or append) one marked section of docs/results.md."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import shlex
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from veil.atomic import write_atomic
from veil.machine import describe

DOCS = Path(__file__).resolve().parents[1] / "docs"


VEIL = [sys.executable, "-m", "veil.cli"]


def run_child(command: list[str]) -> tuple[float, float, str]:
    """(wall seconds, peak RSS GB, stdout) of a child process (RSS from its rusage: the largest child so far)."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}): {done.stderr[-2000:]}")
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return wall, max(peak, before) / 1e6, done.stdout  # ru_maxrss is in kB on Linux


def _status_gb(pid: int, field: str) -> float | None:
    """A live process's /proc status ``field`` (VmHWM: peak resident set, VmRSS: now), GB; None when it is gone."""
    try:
        return int(re.search(rf"{field}:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text()).group(1)) / 1e6
    except (OSError, AttributeError):
        return None


def _peak_rss_gb(pid: int) -> float | None:
    return _status_gb(pid, "VmHWM")


def _pss_gb(pid: int) -> float:
    """A live process's proportional set size (Pss, /proc/<pid>/smaps_rollup), GB: pages shared with other processes
    count as their share, so the Pss of a server and its forked workers add up to their memory, counted once."""
    try:
        return int(re.search(r"^Pss:\s+(\d+) kB", Path(f"/proc/{pid}/smaps_rollup").read_text(), re.M).group(1)) / 1e6
    except (OSError, AttributeError):
        return 0.0


def _descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (Linux /proc/<pid>/task/<tid>/children)."""
    found, stack = [], [pid]
    while stack:
        for task in Path(f"/proc/{stack.pop()}/task").glob("*"):
            with contextlib.suppress(OSError):
                children = [int(c) for c in (task / "children").read_text().split()]
                found += children
                stack += children
    return found


class ServeProcess:
    """``veil serve`` as a process of its own on 127.0.0.1 (its memory told apart from the client's).

    ``with ServeProcess(repo, ["--he-encoded-mb", "512"]) as url: ...``; ``peak_rss_gb`` (VmHWM) is read
    before the server is stopped, and ``worker_peak_rss_gb`` the same of each process it forked (``--he-processes``:
    pages shared copy-on-write with the server count in both); ``peak_total_pss_gb`` is the largest sum of the Pss of
    the server and every process it forked, sampled every ``sample_s`` seconds (shared pages counted once)."""

    def __init__(self, repo: Path, flags: list[str] | None = None, timeout_s: float = 900.0) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.command = [*VEIL, "serve", "--repo", str(repo), "--port", str(self.port), "--log-level", "warning",
                        *(flags or [])]
        self.timeout_s, self.peak_rss_gb, self.process = timeout_s, None, None
        self.worker_peak_rss_gb: list[float] = []
        self.peak_total_pss_gb, self.sample_s, self._stop = 0.0, 1.0, threading.Event()

    def rss_gb(self) -> float | None:
        """The server's resident set now (VmRSS), GB."""
        return _status_gb(self.process.pid, "VmRSS")

    def _sample(self) -> None:
        while not self._stop.wait(self.sample_s):
            pids = [self.process.pid, *_descendants(self.process.pid)]
            self.peak_total_pss_gb = max(self.peak_total_pss_gb, sum(map(_pss_gb, pids)))

    def __enter__(self) -> str:
        self.process = subprocess.Popen(self.command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        url, deadline = f"http://127.0.0.1:{self.port}", time.monotonic() + self.timeout_s
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"veil serve exited ({self.process.returncode}): {self.process.stderr.read()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=5) as response:
                    if response.status == 200:
                        threading.Thread(target=self._sample, daemon=True).start()
                        return url
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.process.kill()
                raise RuntimeError(f"veil serve not ready after {self.timeout_s:.0f} s")
            time.sleep(0.5)

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self.peak_rss_gb = _peak_rss_gb(self.process.pid)
        self.worker_peak_rss_gb = [g for g in map(_peak_rss_gb, _descendants(self.process.pid)) if g is not None]
        self.process.terminate()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()


def write_section(results_md: Path, key: str, body: str) -> None:
    """Put ``body`` between ``<!-- key:begin -->`` and ``<!-- key:end -->``, keeping every other section.

    The body's leading heading becomes a level-2 heading (every section of results.md is a ``##`` sibling, whatever
    level the benchmark's own docs page embeds it at); the file is replaced atomically."""
    begin, end = f"<!-- {key}:begin -->", f"<!-- {key}:end -->"
    body = re.sub(r"\A#+ ", "## ", body.strip())
    section = f"{begin}\n{body}\n{end}"
    text = results_md.read_text() if results_md.exists() else "# veil — measured results\n\n"
    if begin in text:
        head, rest = text.split(begin, 1)
        text = head + section + rest.split(end, 1)[1]
    else:
        text = text.rstrip() + "\n\n" + section + "\n"
    write_atomic(results_md, text)


def save_results(docs: Path, key: str, results: Any, body: str) -> None:
    """Write ``docs/results/<key>.json`` and the ``key`` section of ``docs/results.md`` (each atomically)."""
    write_atomic(docs / "results" / f"{key}.json", json.dumps(results, indent=1))
    write_section(docs / "results.md", key, body)


def save_figure(fig: Any, path: Path) -> None:
    """Lay out, write ``path`` (PNG, 110 dpi; folders created) and close a matplotlib figure."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def environment(threads: str = "", **versions: str) -> dict[str, str]:
    """Where and when a benchmark ran: date, machine with its processor model and vector extensions (``threads``
    appended, e.g. "1 thread") and package versions."""
    return {"date": time.strftime("%Y-%m-%d"), "machine": describe(threads), **versions}


def command_line(script: str, argv: list[str] | None) -> str:
    """The command line that reproduces a run: ``python benchmarks/<script> [argv...]``."""
    argv = sys.argv[1:] if argv is None else argv  # main(None) parsed the real command line
    return f"python benchmarks/{Path(script).name}" + (" " + shlex.join(argv) if argv else "")  # copy-pastable


def argument_parser(doc: str) -> argparse.ArgumentParser:
    """A benchmark's parser: ``doc``'s first line as description, its last paragraph (the commands) as epilog,
    and ``--out`` (the docs folder that results.md, results/ and img/ go into)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0], epilog=doc.rsplit("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DOCS, help="docs folder to write into")
    return parser


async def _keepalive(port: int, request: bytes, counter: list[int]) -> None:
    """One keep-alive HTTP/1.1 connection sending ``request`` while ``counter[0] > 0`` (a client this thin keeps
    the server, not the client, the bottleneck)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        while counter[0] > 0:
            counter[0] -= 1
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            status = head.split(b" ", 2)[1]
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:"))
            body = await reader.readexactly(length)
            if status != b"200":
                raise RuntimeError(f"request failed with HTTP {status.decode()}: {body[:200]!r}")
    finally:
        writer.close()


async def requests_per_second(port: int, request: bytes, n: int, concurrency: int) -> float:
    """Requests/s of ``n`` raw HTTP requests over ``concurrency`` keep-alive connections, after a warm-up round."""
    counter = [concurrency * 4]
    await asyncio.gather(*(_keepalive(port, request, counter) for _ in range(concurrency)))
    counter = [n]
    start = time.perf_counter()
    await asyncio.gather(*(_keepalive(port, request, counter) for _ in range(concurrency)))
    return n / (time.perf_counter() - start)


GRPC_INFER = "/inference.GRPCInferenceService/ModelInfer"


def grpc_infer_request(model: str, inputs: dict[str, Any]) -> bytes:
    """A serialized ``ModelInferRequest`` for ``model`` with ``inputs`` (name -> float32 array) as raw contents."""
    from veil.engine import proto

    request = proto.msg.ModelInferRequest(model_name=model, raw_input_contents=[x.tobytes() for x in inputs.values()])
    for name, x in inputs.items():
        request.inputs.add(name=name, datatype="FP32", shape=x.shape)
    return request.SerializeToString()


async def grpc_requests_per_second(grpc_port: int, request: bytes, n: int, concurrency: int) -> float:
    """Requests/s of ``n`` serialized ``ModelInferRequest`` s over one ``grpc.aio`` channel with ``concurrency``
    calls in flight, after a warm-up round (the gRPC counterpart of :func:`requests_per_second`)."""
    from grpc import aio

    async with aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        call = channel.unary_unary(GRPC_INFER)

        async def worker(counter: list[int]) -> None:
            while counter[0] > 0:
                counter[0] -= 1
                await call(request)

        warm = [concurrency * 4]
        await asyncio.gather(*(worker(warm) for _ in range(concurrency)))
        counter = [n]
        start = time.perf_counter()
        await asyncio.gather(*(worker(counter) for _ in range(concurrency)))
        return n / (time.perf_counter() - start)
