"""A CIFAR-size (32x32x3) polynomial ResNet through the HE compiler: training, `export he --refresh`, the plan.

Trains (or reuses) a PolyResNet on the bundled photos32 task (`veil train uldnet --preset photos32 --arch resnet`:
a stem conv, 3 stages of `--depth` blocks of two 3x3 convs with identity / strided 1x1 shortcuts, global average
pool, fc; PolyNorm + PolyAct throughout), exports it with client-refresh rounds and records what the compiler made:
wall time and peak RSS of the export (a child process), rounds, cuts, levels, N and primes per segment, plaintext
products and key switches per segment, the cost model's predicted seconds per segment, key bytes, plan bytes on disk.

Nothing here runs encrypted: the predicted seconds are the compiler's stated cost model (he/cost.py), labelled as a
prediction; the encrypted run is benchmarks/he_deep.py's job.

    python benchmarks/he_resnet.py --width 8 16 --depth 1 --cache runs
    python benchmarks/he_resnet.py --quick     # width 4, 2 epochs (smoke)
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from common import VEIL, argument_parser, command_line, environment, run_child, save_results


def export_row(width: int, depth: int, epochs: int | None, max_key_mib: int, cache: Path | None) -> dict[str, Any]:
    """Train (or reuse) one photos32 PolyResNet and export it with --refresh: what the compiler made of it."""
    work = Path(tempfile.mkdtemp(prefix="veil-he-resnet-"))
    ck = (cache or work) / (f"photos32-resnet-w{width}-d{depth}" + ("" if epochs is None else f"-e{epochs}"))
    train_s = None
    if not (ck / "metrics.json").is_file():
        command = [*VEIL, "train", "uldnet", "--preset", "photos32", "--arch", "resnet", "--width", str(width),
                   "--depth", str(depth), "--out", str(ck), "--no-progress"]
        train_s = run_child(command + (["--epochs", str(epochs), "--warmup-epochs", "1"] if epochs else []))[0]
    metrics = json.loads((ck / "metrics.json").read_text())
    repo = work / "repo"
    export_s, export_gb, _ = run_child([*VEIL, "export", "he", str(ck), "--repo", str(repo), "--name", "resnet",
                                        "--refresh", "--max-key-mib", str(max_key_mib)])
    version = repo / "resnet" / "1"
    spec = json.loads((version / "segments.json").read_text()) if (version / "segments.json").is_file() else None
    row: dict[str, Any] = {
        "model": {"arch": "resnet", "width": width, "depth": depth, "input": [3, 32, 32],
                  "conv_layers": 1 + 6 * depth + 2, "levels": metrics.get("depth_total"),
                  "test_accuracy": metrics["test_accuracy"], "train_seconds": metrics.get("train_seconds"),
                  "train_wall_s": train_s},
        "export_s": export_s, "export_peak_rss_gb": export_gb,
        "plan_bytes": sum(p.stat().st_size for p in version.rglob("*") if p.is_file()),
    }
    if spec is not None:
        r = spec["report"]
        row.update(rounds=spec["rounds"], cuts=spec["cuts"], key_bytes=r["key_bytes"],
                   predicted_seconds=r["predicted_seconds"], segments=[
                       {"levels": s["levels"], "poly_modulus_degree": s["poly_modulus_degree"],
                        "primes": s["cost"]["primes"], "key_switches": s["cost"]["key_switches"],
                        "plaintext_products": s["cost"]["plaintext_products"], "key_bytes": s["cost"]["key_bytes"],
                        "predicted_s": s["cost"]["predicted_seconds"],
                        "plan_bytes": sum(p.stat().st_size for p in (version / f"segment_{s['index']}").rglob("*"))}
                       for s in r["segments"]])
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="width 4, 2 epochs")
    parser.add_argument("--width", type=int, nargs="+", default=[8],
                        help="ResNet base channels (stages w, 2w, 4w; 16: ResNet-20's), one row each, ascending")
    parser.add_argument("--depth", type=int, default=1, help="blocks per stage (ResNet-20: 3)")
    parser.add_argument("--epochs", type=int, default=None, help="training epochs (default: the preset's)")
    parser.add_argument("--max-key-mib", type=int, default=1024, help="key budget of the segment search")
    parser.add_argument("--cache", type=Path, default=None, help="folder for the checkpoints (reused)")
    args = parser.parse_args(argv)
    widths, epochs = ([4], 2) if args.quick else (sorted(args.width), args.epochs)
    report: dict[str, Any] = {
        "command": command_line(__file__, sys.argv[1:] if argv is None else argv), "environment": environment(),
        "max_key_mib": args.max_key_mib,
        "models": [export_row(width, args.depth, epochs, args.max_key_mib, args.cache) for width in widths],
    }
    # one section per depth: ResNet-20's (depth 3) beside the one-block rows
    save_results(args.out, "he_resnet" if args.depth == 1 else f"he_resnet_d{args.depth}", report, markdown(report))
    print(json.dumps([{k: row.get(k) for k in ("export_s", "export_peak_rss_gb", "rounds", "key_bytes",
                                               "predicted_seconds")} for row in report["models"]], indent=1))
    return 0


def markdown(report: dict[str, Any]) -> str:
    lines = ["## A CIFAR-size polynomial ResNet through the HE compiler (compile only)", "",
             f"`{report['command']}` — {report['environment']['machine']}, {report['environment']['date']}. Key budget "
             f"{report['max_key_mib']} MiB; peak RSS is the largest export child so far (rows run in ascending width).",
             ""]
    for r in report["models"]:
        m = r["model"]
        lines += [
            f"PolyResNet width {m['width']}, {m['depth']} block(s) per stage ({m['conv_layers']} convs with residual "
            f"adds), 32x32x3 photos32 input, {m['levels']} levels, plain test accuracy {100 * m['test_accuracy']:.1f} % "
            f"(trained in {m['train_seconds']} s). `veil export he --refresh`: **{r['export_s']:.0f} s, peak RSS "
            f"{r['export_peak_rss_gb']:.1f} GB**, {r.get('rounds', 1)} rounds, keys {r.get('key_bytes', 0) / 2**20:.0f} "
            f"MiB (as shipped: seeded, zstd), plan {r['plan_bytes'] / 2**30:.2f} GiB on disk.", "",
            "| segment | levels | N | primes | key switches | plaintext products | keys MiB | plan MiB | predicted s |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for k, s in enumerate(r.get("segments", [])):
            lines.append(f"| {k} | {s['levels']} | {s['poly_modulus_degree']} | {s['primes']} | {s['key_switches']} | "
                         f"{s['plaintext_products']} | {s['key_bytes'] / 2**20:.0f} | {s['plan_bytes'] / 2**20:.0f} | "
                         f"{s['predicted_s']:.1f} |")
        lines += ["", f"Predicted seconds per image (he/cost.py's stated model, **a prediction, not a measurement**): "
                      f"{r.get('predicted_seconds', 0):.0f} s.", ""]
    lines.append("Measured encrypted runs: docs/results.md § he_deep (the PolyResNet row).")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
