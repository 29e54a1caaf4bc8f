"""k-clustering with only a noisy quadruplet oracle (issue 23): the R-model coreset against k-means++ / k-medoids
on exact distances and against trusting every answer, on 2-D blobs and on sentences embedded by the bundled
all-MiniLM-L6-v2 served by `veil serve` (the model oracle).

Targets (other_seeds.md §7, blobs n = 2000, k = 5, phi = 0.15): cost <= 3x k-means++ on exact distances;
trust-every-answer >= 2x worse than the algorithm; distinct queries <= c * n * k * ln(n)^2 with c = 4; cost
within 20 % as phi goes 0.05 -> 0.25. "cost" is the k-means objective (sum of squared distances) of the k-centre
clustering (coreset -> k centres as in the paper's experiments); the coreset's own mapping cost is reported too.

    python benchmarks/cluster_oracle.py                    # ~5 min on 2 shared cores (exports MiniLM once)
    python benchmarks/cluster_oracle.py --quick --out /tmp/docs
"""

from __future__ import annotations

import math
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
from common import argument_parser, command_line, environment, save_results
from veil.algorithms.cluster import (
    CoresetConfig,
    CountingOracle,
    ExactOracle,
    ModelOracle,
    PersistentNoisyOracle,
    compose_labels,
    cost_to_centres,
    kmeans_cost,
    kmeans_pp,
    kmedoids,
    mapping_cost,
    rank_model_coreset,
    reduce_to_k,
)

SECTION = "cluster_oracle"
C_BOUND = 4.0  # the stated constant: distinct queries <= C_BOUND * n * k * ln(n)^2
TOPICS = ("exceptions", "debugger", "formatstrings", "typesmapping", "compound")


def blobs(n: int, k: int, seed: int = 0) -> np.ndarray:
    """n 2-D points around k centres uniform in [-10, 10]^2, unit normal noise."""
    rng = np.random.default_rng(seed)
    return rng.uniform(-10, 10, (k, 2))[rng.integers(k, size=n)] + rng.normal(size=(n, 2))


def run(truth, oracle, k: int, config: CoresetConfig) -> dict[str, Any]:
    """One coreset run through a counting oracle: sizes, queries, coreset and k-centre costs, wall time."""
    counting = CountingOracle(oracle)
    start = time.perf_counter()
    coreset = rank_model_coreset(counting, k, config)
    seconds = time.perf_counter() - start
    final = reduce_to_k(coreset, truth.distances, k, seed=config.seed)
    labels = compose_labels(coreset, truth.distances, final)
    n = truth.n
    return {"coreset_size": int(coreset.centers.size), "rounds": coreset.rounds, "queries": coreset.queries,
            "c": coreset.queries / (n * k * math.log(n) ** 2), "coreset_cost": mapping_cost(truth.distances, coreset.mapping),
            "k_cost": mapping_cost(truth.distances, labels), "seconds": seconds, "labels": labels}


def blobs_study(n: int, k: int, phis: list[float]) -> dict[str, Any]:
    points = blobs(n, k)
    truth = ExactOracle(points)
    reference = kmeans_cost(points, kmeans_pp(points, k))
    medoid_cost = cost_to_centres(truth.distances, n, kmedoids(truth.distances, n, k))
    rows = []
    for phi in phis:
        for method, trust in (("coreset", False), ("trust every answer", True)):
            result = run(truth, PersistentNoisyOracle(truth, phi, seed=1), k, CoresetConfig(trust=trust))
            result.pop("labels")
            rows.append({"phi": phi, "method": method, **result})
            print(f"blobs phi={phi} {method}: k-cost {result['k_cost'] / reference:.2f}x, c={result['c']:.2f}",
                  file=sys.stderr)
    exact = run(truth, truth, k, CoresetConfig())
    exact.pop("labels")
    return {"n": n, "k": k, "kmeans_pp_cost": reference, "kmedoids_cost": medoid_cost, "rows": rows,
            "exact_oracle": exact}


def sentences(per_topic: int) -> tuple[list[str], list[int]]:
    """``per_topic`` sentences from each of five pydoc topics (Python's bundled help text) and their topic index."""
    from pydoc_data.topics import topics

    texts, labels = [], []
    for i, topic in enumerate(TOPICS):
        parts = [" ".join(s.split()) for s in re.split(r"(?<=[.:])\s+", topics[topic])]
        parts = [s for s in parts if 30 <= len(s) <= 240 and not s.startswith(("*", "|", ">>>"))]
        texts += parts[:per_topic]
        labels += [i] * len(parts[:per_topic])
    return texts, labels


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def minilm_study(per_topic: int, k: int, phi: float, repo: Path | None) -> dict[str, Any]:
    """Export MiniLM (unless ``repo`` has it), serve it on loopback, cluster sentences through the model oracle."""
    from tokenizers import Tokenizer

    texts, topic = sentences(per_topic)
    workdir = tempfile.TemporaryDirectory()
    if repo is None:
        from veil.export import export_sentence_encoder

        repo = Path(workdir.name) / "models"
        export_sentence_encoder("bundled:all-MiniLM-L6-v2", repo, name="minilm")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "veil.cli", "serve", "--repo", str(repo), "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=2) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("veil serve did not become ready") from None
                time.sleep(0.2)
        tokenizer = Tokenizer.from_file(str(repo / "minilm" / "1" / "tokenizer" / "tokenizer.json"))
        tokenizer.enable_truncation(128)
        tokenizer.enable_padding()
        encoded = tokenizer.encode_batch(texts)
        inputs = {"input_ids": np.array([e.ids for e in encoded], dtype=np.int64),
                  "attention_mask": np.array([e.attention_mask for e in encoded], dtype=np.int64)}
        model = ModelOracle(url, "minilm", inputs, output="sentence_embedding", metric="cosine")
        result = run(model, model, k, CoresetConfig())
        noisy = run(model, PersistentNoisyOracle(model, phi, seed=1), k, CoresetConfig())
        trust = run(model, PersistentNoisyOracle(model, phi, seed=1), k, CoresetConfig(trust=True))
        requests = model.requests
    finally:
        server.terminate()
        server.wait(timeout=30)
        workdir.cleanup()
    n = len(texts)
    medoids = kmedoids(model.distances, n, k)
    out = {"n": n, "k": k, "topics": list(TOPICS), "http_requests": requests,
           "kmedoids_cost": cost_to_centres(model.distances, n, medoids), "phi": phi}
    for name, r in (("model oracle", result), (f"model oracle + noise phi={phi}", noisy),
                    (f"trust every answer, phi={phi}", trust)):
        labels = r.pop("labels")
        out[name] = r | {"topic_purity": purity(labels, topic)}
    out["kmedoids"] = {"topic_purity": purity(medoids[np.argmin(
        model.distances(np.repeat(np.arange(n), k), np.tile(medoids, n)).reshape(n, k), 1)], topic)}
    return out


def purity(labels: np.ndarray, truth: list[int]) -> float:
    """Fraction of items whose cluster's majority topic is their own."""
    truth_arr = np.asarray(truth)
    hits = sum(np.bincount(truth_arr[labels == c]).max() for c in np.unique(labels))
    return float(hits / truth_arr.size)


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--phis", type=float, nargs="+", default=[0.05, 0.1, 0.15, 0.2, 0.25])
    parser.add_argument("--per-topic", type=int, default=60, help="sentences per pydoc topic (5 topics)")
    parser.add_argument("--repo", type=Path, default=None, help="a repository that already serves 'minilm'")
    parser.add_argument("--no-minilm", action="store_true", help="skip the sentence study")
    parser.add_argument("--quick", action="store_true", help="smoke settings")
    args = parser.parse_args(argv)
    if args.quick:
        args.n, args.phis, args.per_topic = 300, [0.05, 0.25], 12
    study = blobs_study(args.n, args.k, args.phis)
    text = None if args.no_minilm else minilm_study(args.per_topic, args.k, 0.15, args.repo)
    ref = study["kmeans_pp_cost"]
    alg = {r["phi"]: r for r in study["rows"] if r["method"] == "coreset"}
    trust = {r["phi"]: r for r in study["rows"] if r["method"] != "coreset"}
    phi0 = 0.15 if 0.15 in alg else args.phis[len(args.phis) // 2]
    k_costs = [alg[p]["k_cost"] for p in args.phis]
    targets = {
        f"phi={phi0}: k-centre cost <= 3x k-means++": (alg[phi0]["k_cost"] / ref, alg[phi0]["k_cost"] <= 3 * ref),
        f"phi={phi0}: coreset mapping cost <= 3x k-means++": (alg[phi0]["coreset_cost"] / ref,
                                                              alg[phi0]["coreset_cost"] <= 3 * ref),
        f"phi={phi0}: trust-every-answer k-centre cost >= 2x the algorithm's": (
            trust[phi0]["k_cost"] / alg[phi0]["k_cost"], trust[phi0]["k_cost"] >= 2 * alg[phi0]["k_cost"]),
        f"phi={phi0}: trust-every-answer coreset cost >= 2x the algorithm's": (
            trust[phi0]["coreset_cost"] / alg[phi0]["coreset_cost"],
            trust[phi0]["coreset_cost"] >= 2 * alg[phi0]["coreset_cost"]),
        f"queries <= {C_BOUND:g} n k ln(n)^2 (max c over phi)": (max(r["c"] for r in alg.values()),
                                                                 max(r["c"] for r in alg.values()) <= C_BOUND),
        f"k-centre cost within 20 % over phi {min(args.phis)} -> {max(args.phis)} (max/min)":
            (max(k_costs) / min(k_costs), max(k_costs) <= 1.2 * min(k_costs)),
    }
    results = {"environment": environment("1 process", numpy=np.__version__),
               "command": command_line(__file__, sys.argv[1:] if argv is None else argv), "blobs": study,
               "sentences": text, "targets": {k: {"value": v, "met": bool(ok)} for k, (v, ok) in targets.items()}}
    save_results(args.out, SECTION, results, markdown(results))
    for name, (value, ok) in targets.items():
        print(f"{'met   ' if ok else 'MISSED'} {name}: {value:.4g}", file=sys.stderr)
    return 0


def markdown(results: dict) -> str:
    env, study = results["environment"], results["blobs"]
    ref = study["kmeans_pp_cost"]
    lines = ["## Clustering with a noisy quadruplet oracle (issue 23)", "",
             f"`{results['command']}` ({env['date']}, {env['machine']}). 2-D blobs, n = {study['n']}, "
             f"k = {study['k']}, persistent noise. Costs are the k-means objective relative to k-means++ on exact "
             f"distances ({ref:.0f}); k-medoids on exact distances: {study['kmedoids_cost'] / ref:.2f}x. "
             "k-centre cost: the coreset reduced to k centres (weighted k-means++ + k-medoids on the coreset "
             "with exact distances, as the paper's experiments); coreset cost: the mapping to the O(k log n) "
             "centres. c = distinct queries / (n k ln² n).", "",
             "| φ | method | centres | rounds | queries | c | coreset cost | k-centre cost | time (s) |",
             "|---|---|---|---|---|---|---|---|---|"]
    exact = study["exact_oracle"]
    lines.append(f"| 0 | coreset, exact oracle | {exact['coreset_size']} | {exact['rounds']} | {exact['queries']:,} | "
                 f"{exact['c']:.2f} | {exact['coreset_cost'] / ref:.2f}x | {exact['k_cost'] / ref:.2f}x | "
                 f"{exact['seconds']:.1f} |")
    for r in study["rows"]:
        lines.append(f"| {r['phi']} | {r['method']} | {r['coreset_size']} | {r['rounds']} | {r['queries']:,} | "
                     f"{r['c']:.2f} | {r['coreset_cost'] / ref:.2f}x | {r['k_cost'] / ref:.2f}x | {r['seconds']:.1f} |")
    text = results["sentences"]
    if text:
        lines += ["", f"Sentences: {text['n']} sentences from {len(text['topics'])} pydoc topics "
                  f"({', '.join(text['topics'])}), embedded by all-MiniLM-L6-v2 served by `veil serve` (OIP v2 "
                  f"JSON, {text['http_requests']} requests: each sentence embedded once), cosine distance, "
                  f"k = {text['k']}. Costs: sum of squared cosine distances relative to k-medoids on the exact "
                  f"embedding distances ({text['kmedoids_cost']:.2f}); topic purity of the k clusters "
                  f"(k-medoids: {text['kmedoids']['topic_purity']:.2f}).", "",
                  "| oracle | centres | queries | c | coreset cost | k-centre cost | purity |", "|---|---|---|---|---|---|---|"]
        for name in [key for key in text if key.startswith(("model oracle", "trust"))]:
            r = text[name]
            lines.append(f"| {name} | {r['coreset_size']} | {r['queries']:,} | {r['c']:.2f} | "
                         f"{r['coreset_cost'] / text['kmedoids_cost']:.2f}x | {r['k_cost'] / text['kmedoids_cost']:.2f}x | "
                         f"{r['topic_purity']:.2f} |")
    lines += ["", "Targets:", ""]
    for name, target in results["targets"].items():
        lines.append(f"- {'met' if target['met'] else '**missed**'}: {name} (measured {target['value']:.3g})")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
