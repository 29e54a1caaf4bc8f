"""Export the bundled all-MiniLM-L6-v2 as a sentence-embedding model (ONNX, fused, optional int8) and embed text.

    python examples/export_minilm.py --repo runs/example-models [--int8]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import onnxruntime as ort
from transformers import AutoTokenizer
from veil.export import export_sentence_encoder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=Path("runs/example-models"))
    parser.add_argument("--int8", action="store_true")
    args = parser.parse_args()

    name = "minilm-int8" if args.int8 else "minilm"
    manifest = export_sentence_encoder("bundled:all-MiniLM-L6-v2", args.repo, name=name,
                                       quantize="int8" if args.int8 else None)
    print("fused operators:", manifest["optimization"]["fused_ops"])
    version_dir = args.repo / name / "1"
    tokenizer = AutoTokenizer.from_pretrained(str(version_dir / "tokenizer"))  # shipped next to the graph
    session = ort.InferenceSession(str(version_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    texts = ["Encrypted inference keeps data private.", "The server never sees the plaintext.", "Bananas are yellow."]
    batch = tokenizer(texts, padding=True, return_tensors="np")
    emb = session.run(["sentence_embedding"], {"input_ids": batch["input_ids"].astype(np.int64),
                                               "attention_mask": batch["attention_mask"].astype(np.int64)})[0]
    print("cosine similarities:\n", np.round(emb @ emb.T, 3))


if __name__ == "__main__":
    main()
