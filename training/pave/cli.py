"""`veil recommend`: which of a repository's models fits my few labelled examples (PAVE specs).

The user's spec is fitted locally on the repository's shared base; the ranking is computed locally, or by a server
(`--url`), in plaintext or privately (`--private`: the vector is CKKS-encrypted, the server sees no score).
Prints JSON (the ranking and the spec settings) on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

EXAMPLE = """example:
  veil export finetuned runs/lora-sentiment --repo models --name sentiment --spec
  veil recommend --repo models --data few_shots.jsonl            # lines: {"text": "...", "label": 1}
  veil serve --repo models &  veil recommend --repo models --data few_shots.jsonl --url http://127.0.0.1:8000 --private
"""


def build_parser(prog: str = "veil recommend") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0], epilog=EXAMPLE,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", type=Path, required=True, help="model repository folder with PAVE specs")
    parser.add_argument("--data", type=Path, required=True, help="JSONL of {\"text\": str, \"label\": int} (e.g. 32 lines)")
    parser.add_argument("--url", default=None, help="a `veil serve` of the repository: rank there (POST /v2/recommend)")
    parser.add_argument("--private", action="store_true", help="encrypt the spec vector (CKKS, 128-bit)")
    parser.add_argument("--top-k", type=int, default=None, help="print only the best K models")
    parser.add_argument("--base", default=None, help="the base's transformers folder (default: the bundled MiniLM)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.top_k is not None and args.top_k < 1:
        raise ValueError(f"--top-k: expected an int >= 1, received {args.top_k}")
    from .recommend import read_few_shots, recommend

    texts, labels = read_few_shots(args.data)
    print(json.dumps(recommend(args.repo, texts, labels, url=args.url, private=args.private, top_k=args.top_k,
                               base=args.base), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
