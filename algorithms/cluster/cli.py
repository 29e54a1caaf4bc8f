"""`veil cluster`: k-clustering from a quadruplet oracle only ("is d(a, b) <= d(c, d)?"), the R-model.

DATA is JSON Lines: one object per item with ``"x"`` (a list of numbers) or ``"text"`` (a string), and an optional
``"id"``. The oracle is ``exact`` (Euclidean or cosine on x), ``noisy`` (the same with persistent noise phi) or
``model`` (a served veil model's embeddings over the Open Inference Protocol, e.g. an exported all-MiniLM-L6-v2:
texts are tokenized with the tokenizer shipped next to the model). The coreset (O(k log n) centres and a mapping)
is found with the oracle alone; the final k centres are picked among the coreset with the oracle's distances
(exact / model; the noisy oracle's underlying truth), as the paper's experiments do. A summary goes to stdout as
JSON; ``--out`` writes one JSONL line per item: its id, its coreset centre and its cluster.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

EXAMPLE = """example:
  python -c "import json, random; [print(json.dumps({'x': [random.gauss(c, 1), random.gauss(-c, 1)]})) for c in (0, 8, 16) for _ in range(100)]" > pts.jsonl
  veil cluster --data pts.jsonl --k 3 --oracle noisy --phi 0.15 --out labels.jsonl
  veil cluster --data sentences.jsonl --k 4 --oracle model --server http://127.0.0.1:8000 --model minilm \\
      --tokenizer models/minilm/1/tokenizer
"""


def build_parser() -> argparse.ArgumentParser:
    from .coreset import CoresetConfig

    parser = argparse.ArgumentParser(prog="veil cluster", description=__doc__.splitlines()[0], epilog=EXAMPLE,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="JSONL items with \"x\" or \"text\"")
    parser.add_argument("--k", type=int, required=True, help="the number of clusters")
    parser.add_argument("--oracle", choices=["exact", "noisy", "model"], default="noisy", help="default: noisy")
    parser.add_argument("--phi", type=float, default=0.15, help="the noisy oracle's error probability (default: 0.15)")
    parser.add_argument("--noise-seed", type=int, default=0, help="the noisy oracle's noise draw (default: 0)")
    parser.add_argument("--metric", choices=["euclidean", "cosine"], default="euclidean",
                        help="distance on x (exact / noisy) or on the embeddings (model: default cosine)")
    parser.add_argument("--server", default="http://127.0.0.1:8000", help="model oracle: the OIP server")
    parser.add_argument("--model", default="minilm", help="model oracle: the model name (default: minilm)")
    parser.add_argument("--tokenizer", type=Path, default=None,
                        help="model oracle on texts: the tokenizer folder shipped next to the model")
    parser.add_argument("--input-name", default="x", help="model oracle on x: the model input's name (default: x)")
    parser.add_argument("--max-length", type=int, default=128, help="model oracle: tokens per text (default: 128)")
    parser.add_argument("--out", type=Path, default=None, help="write per-item assignments here (JSONL)")
    CoresetConfig.add_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    import json

    import numpy as np

    from veil.atomic import write_atomic
    from veil.config import ConfigError

    from ..errors import AlgorithmsError
    from .coreset import CoresetConfig, compose_labels, mapping_cost, rank_model_coreset, reduce_to_k
    from .data import load_jsonl
    from .oracles import CountingOracle, ExactOracle, PersistentNoisyOracle

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        items = load_jsonl(args.data)
        config = CoresetConfig.from_args(args)
        if args.oracle == "model":
            truth = _model_oracle(args, items)
        elif items.points is None:
            parser.exit(2, f"veil cluster: error: --oracle {args.oracle}: expected items with \"x\", received texts "
                           "(use --oracle model)\n")
        else:
            truth = ExactOracle(items.points, args.metric)
        oracle = CountingOracle(PersistentNoisyOracle(truth, args.phi, args.noise_seed) if args.oracle == "noisy"
                                else truth)
        coreset = rank_model_coreset(oracle, args.k, config, progress=lambda i, left: print(
            f"round {i}: {left} points left, {oracle.queries:,} queries so far", file=sys.stderr))
        final = reduce_to_k(coreset, truth.distances, min(args.k, coreset.centers.size), seed=config.seed)
        labels = compose_labels(coreset, truth.distances, final)
    except (AlgorithmsError, ConfigError, FileNotFoundError) as exc:
        parser.exit(2, f"veil cluster: error: {exc}\n")
    n = len(items)
    cluster_of = {int(c): i for i, c in enumerate(final)}
    summary = {"n": n, "k": args.k, "oracle": args.oracle, "coreset_size": int(coreset.centers.size),
               "rounds": coreset.rounds, "queries": coreset.queries,
               "queries_per_n_k_ln2n": round(coreset.queries / (n * args.k * max(np.log(n), 1.0) ** 2), 3),
               "coreset_cost": mapping_cost(truth.distances, coreset.mapping),
               "k_cost": mapping_cost(truth.distances, labels), "cost": "sum of squared distances",
               "cluster_sizes": np.bincount([cluster_of[int(c)] for c in labels], minlength=final.size).tolist(),
               "config": config.to_dict()}
    if args.out is not None:
        lines = [json.dumps({"id": items.ids[v], "centre": items.ids[int(coreset.mapping[v])],
                             "cluster": cluster_of[int(labels[v])]}) for v in range(n)]
        write_atomic(args.out, "\n".join(lines) + "\n")
        summary["out"] = str(args.out)
    print(json.dumps(summary, indent=1))
    return 0


def _model_oracle(args: argparse.Namespace, items):
    """The model oracle over ``items``: texts tokenized with ``--tokenizer``, or x sent as ``--input-name``."""
    import numpy as np

    from ..errors import InputError
    from .oracles import ModelOracle

    metric = "cosine" if args.metric == "euclidean" and items.texts is not None else args.metric
    if items.texts is None:
        return ModelOracle(args.server, args.model, {args.input_name: items.points.astype(np.float32)}, metric=metric)
    if args.tokenizer is None:
        raise InputError("--tokenizer", "the tokenizer folder of the served model (texts need tokenizing)", None)
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(args.tokenizer / "tokenizer.json"))
    tokenizer.enable_truncation(args.max_length)
    tokenizer.enable_padding()
    encoded = tokenizer.encode_batch(items.texts)
    inputs = {"input_ids": np.array([e.ids for e in encoded], dtype=np.int64),
              "attention_mask": np.array([e.attention_mask for e in encoded], dtype=np.int64)}
    return ModelOracle(args.server, args.model, inputs, metric=metric)


if __name__ == "__main__":
    sys.exit(main())
