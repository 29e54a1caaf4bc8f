"""Train the tiny byte-level Llama LM with one optimizer, save it, reload it and let it write some Python help text.

    python examples/train_tiny_lm.py                                   # alice, tiny preset, 300 steps (~1-2 min)
    python examples/train_tiny_lm.py --optimizer racs --text notes.txt # your own text file
    python examples/train_tiny_lm.py --preset micro --steps 40         # a few seconds
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from veil.training.lm import (
    PRESETS,
    ByteTokenizer,
    LMModelConfig,
    LMTrainConfig,
    load_lm,
    load_pydoc_topics,
    load_text_file,
    save_lm,
    train_lm,
)


@torch.no_grad()
def generate(model: torch.nn.Module, prompt: str, length: int, seed: int = 0, temperature: float = 0.8) -> str:
    """Sample ``length`` bytes after ``prompt`` (temperature sampling, seeded)."""
    tok, generator = ByteTokenizer(), torch.Generator().manual_seed(seed)
    ids = tok.encode(prompt)[None]  # (1, T)
    for _ in range(length):
        logits = model(input_ids=ids[:, -model.config.max_position_embeddings:]).logits[0, -1]  # (256,)
        probs = torch.softmax(logits / temperature, dim=-1)
        ids = torch.cat([ids, torch.multinomial(probs, 1, generator=generator)[None]], dim=1)
    return tok.decode(ids[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--optimizer", default="alice", help="adamw, racs, alice, ... (default: alice)")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--text", type=Path, default=None, help="your own text file (default: Python's help topics)")
    parser.add_argument("--out", type=Path, default=Path("runs/tiny-lm"))
    args = parser.parse_args()

    torch.set_num_threads(1)  # the tiny model is fastest on one core; also makes the run reproducible
    corpus = load_text_file(args.text) if args.text else load_pydoc_topics()
    train = LMTrainConfig(optimizer=args.optimizer, steps=args.steps, eval_every=max(1, args.steps // 5))
    result = train_lm(LMModelConfig(**PRESETS[args.preset]), train, corpus)
    m = result.metrics
    print(f"{m['optimizer']} (lr {m['lr']:g}), {m['parameters']:,} parameters, {args.steps} steps: held-out loss "
          f"{m['held_out_loss']:.3f} nats/byte, perplexity {m['held_out_perplexity']:.2f}, "
          f"{m['held_out_bits_per_byte']:.2f} bits/byte")
    print(f"optimizer state: {m['optimizer_state_bytes']:,} bytes ({m['optimizer_state_bytes'] / m['parameter_bytes']:.2f}x "
          f"the parameters; Adam holds 2x)")

    save_lm(result, args.out, corpus)
    model, _ = load_lm(args.out)
    print(f"saved and reloaded {args.out}; sample:")
    print(generate(model, "The ", 200))


if __name__ == "__main__":
    main()
