"""Every core for one encrypted image: veil's serial PlanEvaluator against the ParallelEvaluator (he/parallel.py).

One image per call, the same ciphertext through both evaluators, calls interleaved call by call (the order swaps
each round), server time only (no encryption or decryption), >= 7 calls per side: median, min-max, the 1-min load
average before and after (other people compute on this machine), the speedup of the medians and the CPU seconds per
wall second of the parent plus its workers. Memory: the parent's RSS, and each worker's RSS and PSS (proportional
set size: pages shared copy-on-write with the parent count 1/n), so the shared encoded plaintexts are not counted
twice. Agreement: the largest |serial - parallel| of the decrypted logits and the argmax agreement.

Models: (a) veil's ``digits-he`` PolyCNN (``veil train uldnet --preset digits-he --arch cnn``, trained here through
the training API, as benchmarks/he_cnn.py does), (b) TenSEAL Tutorial 4's own network at 28x28 (benchmarks/he_cnn.py's
builder: the digits upscaled to 28x28), compiled by veil at the smallest ring that holds it (N = 8192).

    .venv/bin/python benchmarks/he_cores.py                   # docs/results/he_cores.json and docs/results.md
    .venv/bin/python benchmarks/he_cores.py --quick           # smoke run (short training, 3 calls)
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
from common import argument_parser, command_line, environment, save_results
from he_cnn import (
    TUTORIAL_N,
    TutorialNet,
    cpu_seconds,
    digits_28,
    fitting_precision,
    onnx_of,
    polycnn,
    spread,
    train_tutorial,
)
from veil.he.compiler import compile as he_compile
from veil.he.evaluate import PlanEvaluator
from veil.he.keys import SecretKeyring
from veil.he.parallel import ParallelEvaluator
from veil.he.pool import default_processes
from veil.training.uldnet import load_digits_preset

MIB = 2**20


def _status_kib(pid: int, field: str, name: str = "status") -> int:
    for line in Path(f"/proc/{pid}/{name}").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def memory(evaluator: ParallelEvaluator) -> dict:
    """The parent's RSS, each worker's RSS and PSS (MiB)."""
    workers = [{"rss_mib": _status_kib(pid, "VmRSS") / 1024, "pss_mib": _status_kib(pid, "Pss", "smaps_rollup") / 1024}
               for pid in evaluator.worker_pids()]
    return {"parent_rss_mib": _status_kib(os.getpid(), "VmRSS") / 1024,
            "parent_pss_mib": _status_kib(os.getpid(), "Pss", "smaps_rollup") / 1024, "workers": workers}


def measure(name: str, graph, x: np.ndarray, calls: int, processes: int, precision_bits: int = 20) -> dict:
    """Serial vs parallel on ``calls`` single images of ``x``, interleaved."""
    plan = he_compile(graph, mode="latency", precision_bits=precision_bits)
    params = plan.parameters()
    ring = SecretKeyring.generate(params, plan.galois_steps)
    keys = ring.evaluation_keys()
    serial = PlanEvaluator(plan, params)
    rss_before_fork = _status_kib(os.getpid(), "VmRSS") / 1024
    parallel = ParallelEvaluator(plan, params, processes=processes)
    sides = {"serial": serial, "parallel": parallel}
    record = {k: {"wall": [], "cpu": [], "logits": []} for k in sides}
    warm = ring.encrypt(plan.encode_inputs(x[:1]))
    parallel.run(warm, keys)  # the workers receive and parse the key set once (the first request of a key set)
    serial.run(warm, keys)
    load_before = os.getloadavg()
    for i in range(calls):
        cts = ring.encrypt(plan.encode_inputs(x[i:i + 1]))
        for side in (["serial", "parallel"] if i % 2 == 0 else ["parallel", "serial"]):
            evaluator = sides[side]
            pids = [os.getpid()] + (parallel.worker_pids() if side == "parallel" else [])
            cpu, start = cpu_seconds(pids), time.perf_counter()
            out = evaluator.run(cts, keys)
            wall = time.perf_counter() - start
            record[side]["wall"].append(wall)
            record[side]["cpu"].append(cpu_seconds(pids) - cpu)
            record[side]["logits"].append(plan.decode_outputs(ring.decrypt(out), 1)[0])
    load_after = os.getloadavg()
    mem = memory(parallel)
    failures = parallel.failures
    parallel.close()
    s, p = (np.array(record[k]["logits"]) for k in ("serial", "parallel"))
    linear = [op for op in plan.ops if op["op"] == "linear"]
    split = [op["node"] for op, enc in zip(plan.ops, parallel.encoded, strict=True)
             if op["op"] == "linear" and parallel.partition(enc, processes) is not None]
    rows = {k: {"one_image": spread(r["wall"]), "cpu_per_wall": sum(r["cpu"]) / sum(r["wall"])}
            for k, r in record.items()}
    return {"model": name, "poly_modulus_degree": params.poly_modulus_degree,
            "coeff_mod_bit_sizes": list(params.coeff_mod_bit_sizes), "levels": plan.levels,
            "galois_keys": len(plan.galois_steps), "key_mib": keys.size_bytes / MIB, "processes": processes,
            "linear_ops": len(linear), "linear_ops_split": split, **rows,
            "speedup_median": rows["serial"]["one_image"]["median_s"] / rows["parallel"]["one_image"]["median_s"],
            "max_abs_difference": float(np.abs(s - p).max()), "argmax_agreement": float((s.argmax(1) == p.argmax(1)).mean()),
            "worker_failures": failures, "rss_mib_before_fork": rss_before_fork, "memory": mem,
            "load_1min_before": load_before[0], "load_1min_after": load_after[0]}


def markdown(report: dict) -> str:
    lines = ["## Every core for one encrypted image (issue 35 item 2)", "",
             f"`{report['command']}` — {report['environment']['date']}, {report['environment']['machine']}; "
             f"{report['processes']} processes (the parent and {report['processes'] - 1} forked workers). "
             "One image per call, the same ciphertext through the serial `PlanEvaluator` and the "
             "`ParallelEvaluator` (he/parallel.py), calls interleaved, server time only; median (min-max) of "
             f"{report['calls']} calls per side. CPU/wall counts the parent and its workers. Memory: the parent's "
             "RSS after the fork, each worker's PSS (pages shared copy-on-write count once).", "",
             "| model | N | key MiB | linear ops split | serial s | parallel s | speedup | CPU/wall serial, parallel "
             "| CPU s per image serial, parallel | max abs diff, argmax agreement | parent RSS MiB | worker PSS MiB (RSS) | load 1 min before, after |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["runs"]:
        if "skipped" in r:
            lines.append(f"| {r['model']} | skipped: {r['skipped']} |" + " |" * 11)
            continue
        s, p = r["serial"]["one_image"], r["parallel"]["one_image"]
        workers = ", ".join(f"{w['pss_mib']:.0f} ({w['rss_mib']:.0f})" for w in r["memory"]["workers"])
        lines.append(
            f"| {r['model']} | {r['poly_modulus_degree']} | {r['key_mib']:.0f} | {len(r['linear_ops_split'])} of "
            f"{r['linear_ops']} | {s['median_s']:.3f} ({s['min_s']:.3f}-{s['max_s']:.3f}) | {p['median_s']:.3f} "
            f"({p['min_s']:.3f}-{p['max_s']:.3f}) | **{r['speedup_median']:.2f}x** | {r['serial']['cpu_per_wall']:.2f}, "
            f"{r['parallel']['cpu_per_wall']:.2f} | {r['serial']['cpu_per_wall'] * s['median_s']:.2f}, "
            f"{r['parallel']['cpu_per_wall'] * p['median_s']:.2f} | {r['max_abs_difference']:.1e}, {100 * r['argmax_agreement']:.0f} % "
            f"| {r['memory']['parent_rss_mib']:.0f} | {workers} | {r['load_1min_before']:.2f}, {r['load_1min_after']:.2f} |")
    lines += ["", "CPU s per image = CPU/wall x the median: the work the split adds (baby rotations repeated in "
              "every share, and each split op's input and partial sums through the pipes). The speedup needs a free core per process: where another job "
              "holds a core (the load average column), the processes share what is left and the added work makes "
              "the parallel side slower.", "", "A perfect split on W cores is W x; a giant-step split of a BSGS op "
              "repeats its baby rotations in every share (at best sqrt(2) on 2 processes), and what no process "
              "splits (the non-linear ops, the folds, the bias and rescale of each split op, and each ciphertext "
              "through a pipe: a SEAL save with zstd and a parse) bounds it below that (Amdahl)."]
    return "\n".join(lines) + "\n"


def render(path: Path, out: Path) -> None:
    """Write docs/results.md's section again from a run's JSON (``--render``)."""
    report = json.loads(path.read_text())
    save_results(out, "he_cores", report, markdown(report))


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="smoke run: short training, 3 calls")
    parser.add_argument("--calls", type=int, default=9, help="single-image calls per side (median)")
    parser.add_argument("--processes", type=int, default=default_processes(), help="processes of the parallel side")
    parser.add_argument("--tutorial-epochs", type=int, default=30, help="epochs of the tutorial network (timing "
                        "does not depend on them)")
    parser.add_argument("--seed", type=int, default=0, help="training seed of the digits-he PolyCNN")
    parser.add_argument("--short-training", action="store_true", help="train the PolyCNN for 2 epochs only (the "
                        "evaluation time does not depend on the weights' accuracy)")
    parser.add_argument("--render", type=Path, default=None, help="only re-render results.md from this JSON")
    args = parser.parse_args(argv)
    if args.render is not None:
        render(args.render, args.out)
        return 0
    calls = 3 if args.quick else args.calls
    if calls < 1 or args.processes < 2:
        parser.error(f"--calls >= 1 and --processes >= 2 expected, received {calls} and {args.processes}")
    torch.set_num_threads(1)
    digits = load_digits_preset()
    x8 = digits.x_test.astype(np.float64)
    trained, preset = polycnn(args.seed, args.quick or args.short_training, digits)
    graph, _ = onnx_of(trained.model, [1, 8, 8])
    runs = [measure("digits-he PolyCNN (8x8)", graph, x8, calls, args.processes)]
    runs[0]["plain_test_accuracy"] = trained.metrics["test_accuracy"]
    tutorial = train_tutorial(TutorialNet(), digits_28(digits.x_train), digits.y_train, 2 if args.quick else args.tutorial_epochs)
    graph28, _ = onnx_of(tutorial, [1, 28, 28])
    runs.append(measure("TenSEAL tutorial network (28x28)", graph28, digits_28(x8), calls, args.processes,
                        fitting_precision(graph28, TUTORIAL_N)))
    report = {"command": command_line(__file__, sys.argv[1:] if argv is None else argv),
              "environment": environment(f"{args.processes} processes"), "processes": args.processes, "calls": calls,
              "polycnn": {"preset": preset, "seed": args.seed, "short_training": args.quick or args.short_training}, "runs": runs}
    save_results(args.out, "he_cores", report, markdown(report))
    print(json.dumps([{k: r[k] for k in ("model", "speedup_median", "max_abs_difference")} for r in runs], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
