"""Compress a tiny byte-level LM with SAES-SVD through the recipe API, compare it with SVD-LLM and plain SVD,
reload the result and export it to ONNX (two MatMuls per factorised layer).

    python examples/compress_tiny_lm.py                        # micro LM, 300 steps, 40 % removal (~1 min)
    python examples/compress_tiny_lm.py --steps 60 --ratio 0.6 --out runs/lm-saes60
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

import torch
from veil.export.compressed import export_compressed
from veil.training.compress import api
from veil.training.compress.calibration import Calibration
from veil.training.compress.workloads import lm_calibration, lm_eval_blocks, lm_perplexity
from veil.training.lm import PRESETS, LMModelConfig, LMTrainConfig, load_pydoc_topics, train_lm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="training steps of the micro LM")
    parser.add_argument("--ratio", type=float, default=0.4, help="fraction of the factorised weights removed")
    parser.add_argument("--out", type=Path, default=Path("runs/lm-saes"), help="compressed model folder")
    args = parser.parse_args()
    torch.set_num_threads(1)

    # 1. a small LM trained on Python's help pages (fixed held-out topics)
    train = LMTrainConfig(steps=args.steps, batch_size=16, block_size=64, eval_every=args.steps, seed=0)
    model = train_lm(LMModelConfig(**PRESETS["micro"]), train, load_pydoc_topics(), progress=False).model.eval()
    calibration = lm_calibration(num_sequences=16, seq_len=64, batch_size=8)  # training bytes only
    blocks = lm_eval_blocks(seq_len=64, max_blocks=32)  # held-out topics
    held = Calibration.from_tokens(blocks[:, :-1], batch_size=8)
    print(f"uncompressed: held-out perplexity {lm_perplexity(model, blocks)['held_out_perplexity']:.3f}")

    # 2. the same recipe with each method; SAES-SVD's run writes the model and report
    for method in ("svd", "svd_llm", "saes_svd"):
        candidate = copy.deepcopy(model)
        recipe = {"seed": 0, "stages": [{"method": method, "ratio": args.ratio, "ignore": ["lm_head"]}]}
        report = api.compress(candidate, recipe, calibration, args.out if method == "saes_svd" else None,
                              eval_fn=lambda m: lm_perplexity(m, blocks), eval_data=held, progress=False)
        fac = report["parameters"]["factorised_layers"]
        print(f"{method:>8}: perplexity {report['metrics']['after']['held_out_perplexity']:.3f}, "
              f"last-block drift {report['drift'][-1]['rel_error']:.3f}, factorised layers keep "
              f"{fac['keep_ratio']:.3f} (removed {fac['compression_ratio']:.3f})")

    # 3. reload from the folder and export to a model repository the engine serves
    reloaded, config = api.load_compressed(args.out)
    manifest = export_compressed(reloaded, args.out / "repo", "lm-saes")
    print(f"reloaded {len(config['factorized'])} factorised layers; ONNX MatMul pairs "
          f"{manifest['compression']['matmul_pairs']}, ORT == torch: {manifest['validation']['passed']}")
    print(f"report: {args.out / 'report.md'}; serve with: veil serve --repo {args.out / 'repo'}")


if __name__ == "__main__":
    main()
