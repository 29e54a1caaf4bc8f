"""Break a tiny LM's refusals with a harmful fine-tune, then patch them back with one example (Safety at One Shot).

Pretrains a byte-level Llama on pydoc text, aligns it to answer benign rule tasks and refuse a synthetic, fictional harmful class, fine-tunes
it on harmful completions, picks one refusal example and fine-tunes on it for 10 steps; prints the safety gate
(ASR, benign utility) after each phase. Every PipelineConfig field is a flag (see --help).

    python examples/safety_realign_tiny.py                                  # tiny preset, defaults (~20 min, 1 core)
    python examples/safety_realign_tiny.py --preset micro --pretrain-steps 100 --align-steps 60 --candidates 4 \\
        --eval-harmful 16 \\
        --eval-benign 16 --eval-downstream 8 --compress-ratios 0.2          # mechanics only, ~20 s
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
from veil.training.compress.safety import PipelineConfig, run_pipeline


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 2)[2],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    PipelineConfig.add_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the whole result as JSON")
    parser.add_argument("--cache", default=None, help="keep the base / aligned / attacked models here and reuse them")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    cfg = PipelineConfig.from_args(args)
    out = run_pipeline(cfg, progress=lambda s: print(s[:160], file=sys.stderr, flush=True), cache_dir=args.cache)
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"{cfg.preset} preset, seed {cfg.seed}; one example ({cfg.selection}): {tuple(out['selection']['example'])}")
    print(f"{'phase':<10} {'ASR %':>7} {'utility %':>10} {'downstream %':>13}")
    rows = dict(out["phases"])
    for inter in out.get("compression", []):  # --compress-ratios: SAES-SVD on the patched model, then re-patch
        rows |= {f"+svd {inter['ratio']:g}": inter["compressed"],
                 f"+repatch {inter['ratio']:g}" + (" (skipped)" if inter["repatch_skipped"] else ""): inter["repatched"]}
    for name, row in rows.items():
        print(f"{name:<10} {row['asr']:>7.1f} {row['utility']:>10.1f} {row.get('downstream', float('nan')):>13.1f}")
    patched = out["phases"]["patched"]
    print(f"patch: {patched['steps']} steps in {patched['seconds']:.2f} s, loss {patched['loss_first']:.3f} -> "
          f"{patched['loss_last']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
