"""A CIFAR-size (32x32x3) polynomial ResNet through the HE compiler: training, `export he --refresh`, the plan.

Trains (or reuses) a PolyResNet on the bundled photos32 task (`veil train uldnet --preset photos32 --arch resnet`:
a stem conv, 3 stages of `--depth` blocks of two 3x3 convs with identity / strided 1x1 shortcuts, global average
pool, fc; PolyNorm + PolyAct throughout), exports it with client-refresh rounds and records what the compiler made:
wall time and peak RSS of the export (a child process), rounds, cuts, levels, N and primes per segment, plaintext
products and key switches per segment, the cost model's predicted seconds per segment, key bytes, plan bytes on disk.

Nothing here runs encrypted: the predicted seconds are the compiler's stated cost model (he/cost.py), labelled as a
prediction; the encrypted run is benchmarks/he_deep.py's job.

    python benchmarks/he_resnet.py --width 8 --depth 1 --max-key-mib 1200
    python benchmarks/he_resnet.py --quick     # width 4, 2 epochs (smoke)
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from common import VEIL, argument_parser, command_line, environment, run_child, save_results


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="width 4, 2 epochs")
    parser.add_argument("--width", type=int, default=8, help="ResNet base channels (stages w, 2w, 4w)")
    parser.add_argument("--depth", type=int, default=1, help="blocks per stage (ResNet-20: 3)")
    parser.add_argument("--epochs", type=int, default=None, help="training epochs (default: the preset's)")
    parser.add_argument("--max-key-mib", type=int, default=1024, help="key budget of the segment search")
    parser.add_argument("--cache", type=Path, default=None, help="folder for the checkpoint (reused)")
    args = parser.parse_args(argv)
    width, epochs = (4, 2) if args.quick else (args.width, args.epochs)
    work = Path(tempfile.mkdtemp(prefix="veil-he-resnet-"))
    ck = (args.cache or work) / (f"photos32-resnet-w{width}-d{args.depth}" + ("" if epochs is None else f"-e{epochs}"))
    train_s = None
    if not (ck / "metrics.json").is_file():
        command = [*VEIL, "train", "uldnet", "--preset", "photos32", "--arch", "resnet", "--width", str(width),
                   "--depth", str(args.depth), "--out", str(ck), "--no-progress"]
        train_s = run_child(command + (["--epochs", str(epochs), "--warmup-epochs", "1"] if epochs else []))[0]
    metrics = json.loads((ck / "metrics.json").read_text())
    repo = work / "repo"
    export_s, export_gb, _ = run_child([*VEIL, "export", "he", str(ck), "--repo", str(repo), "--name", "resnet",
                                     "--refresh", "--max-key-mib", str(args.max_key_mib)])
    version = repo / "resnet" / "1"
    spec = json.loads((version / "segments.json").read_text()) if (version / "segments.json").is_file() else None
    report: dict[str, Any] = {
        "command": command_line(__file__, sys.argv[1:] if argv is None else argv), "environment": environment(),
        "model": {"arch": "resnet", "width": width, "depth": args.depth, "input": [3, 32, 32],
                  "conv_layers": 1 + 6 * args.depth + 2, "levels": metrics.get("depth_total"),
                  "test_accuracy": metrics["test_accuracy"], "train_seconds": metrics.get("train_seconds"),
                  "train_wall_s": train_s},
        "export_s": export_s, "export_peak_rss_gb": export_gb,
        "plan_bytes": sum(p.stat().st_size for p in version.rglob("*") if p.is_file()),
    }
    if spec is not None:
        r = spec["report"]
        report.update(rounds=spec["rounds"], cuts=spec["cuts"], key_bytes=r["key_bytes"],
                      predicted_seconds=r["predicted_seconds"], segments=[
                          {"levels": s["levels"], "poly_modulus_degree": s["poly_modulus_degree"],
                           "primes": s["cost"]["primes"], "key_switches": s["cost"]["key_switches"],
                           "plaintext_products": s["cost"]["plaintext_products"], "key_bytes": s["cost"]["key_bytes"],
                           "predicted_s": s["cost"]["predicted_seconds"],
                           "plan_bytes": sum(p.stat().st_size for p in (version / f"segment_{s['index']}").rglob("*"))}
                          for s in r["segments"]])
    save_results(args.out, "he_resnet", report, markdown(report))
    print(json.dumps({k: report.get(k) for k in ("export_s", "export_peak_rss_gb", "rounds", "key_bytes",
                                                 "predicted_seconds")}, indent=1))
    return 0


def markdown(r: dict[str, Any]) -> str:
    m = r["model"]
    lines = [
        "## A CIFAR-size polynomial ResNet through the HE compiler (compile only)", "",
        f"`{r['command']}` — {r['environment']['machine']}, {r['environment']['date']}.", "",
        f"PolyResNet width {m['width']}, {m['depth']} block(s) per stage ({m['conv_layers']} convs with residual adds), "
        f"32x32x3 photos32 input, {m['levels']} levels, plain test accuracy {100 * m['test_accuracy']:.1f} % "
        f"(trained in {m['train_seconds']} s). `veil export he --refresh`: **{r['export_s']:.0f} s, peak RSS "
        f"{r['export_peak_rss_gb']:.1f} GB**, {r.get('rounds', 1)} rounds, keys {r.get('key_bytes', 0) / 2**20:.0f} MiB, "
        f"plan {r['plan_bytes'] / 2**30:.2f} GiB on disk.", "",
        "| segment | levels | N | primes | key switches | plaintext products | keys MiB | plan MiB | predicted s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for k, s in enumerate(r.get("segments", [])):
        lines.append(f"| {k} | {s['levels']} | {s['poly_modulus_degree']} | {s['primes']} | {s['key_switches']} | "
                     f"{s['plaintext_products']} | {s['key_bytes'] / 2**20:.0f} | {s['plan_bytes'] / 2**20:.0f} | "
                     f"{s['predicted_s']:.1f} |")
    lines += ["", f"Predicted seconds per image (he/cost.py's stated model, **a prediction, not a measurement**): "
                  f"{r.get('predicted_seconds', 0):.0f} s. Not run encrypted here: see the notes under the table in "
                  "docs/he.md (CIFAR-size models)."]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
