"""Encrypted inference end to end: train an HE-sized PolyMLP, compile it to a CKKS plan, serve it, query it
with ciphertexts only (the secret key never leaves this process).

    python examples/encrypted_inference.py --epochs 60 --images 4 --workdir runs/example-he
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from veil.export.he import export_he
from veil.he.client import HeSession
from veil.training.uldnet import ModelConfig, TrainConfig, load_digits_preset, save_uldnet, train_uldnet
from veil.training.uldnet.config import DIGITS_HE_PRESET

from veil.demo import running_server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=DIGITS_HE_PRESET["train"]["epochs"])
    parser.add_argument("--images", type=int, default=4, help="test images to classify encrypted")
    parser.add_argument("--mode", choices=["latency", "throughput"], default="latency")
    parser.add_argument("--workdir", type=Path, default=Path("runs/example-he"))
    args = parser.parse_args()

    data = load_digits_preset()
    model_config = ModelConfig(input_shape=data.input_shape, **DIGITS_HE_PRESET["model"])
    train_config = TrainConfig(**{**DIGITS_HE_PRESET["train"], "epochs": args.epochs}, warmup_epochs=min(5, args.epochs - 1))
    save_uldnet(train_uldnet(model_config, train_config, data), args.workdir / "polymlp", data)
    manifest = export_he(args.workdir / "polymlp", args.workdir / "models", "digits-he", mode=args.mode)
    print(f"plan: {manifest['levels']} levels, N={manifest['parameters']['poly_modulus_degree']}, "
          f"{len(manifest['galois_steps'])} rotation keys")

    with running_server(args.workdir / "models") as url:
        session = HeSession.create(url, "digits-he", args.workdir / "client.keyring")  # keygen + register keys
        x = data.x_test[: args.images]
        logits = session.decrypt(session.infer(session.encrypt(x)))  # only ciphertexts travel
    print("encrypted predictions:", logits.argmax(1).tolist(), " labels:", data.y_test[: args.images].tolist())
    print("agreement with labels:", float(np.mean(logits.argmax(1) == data.y_test[: args.images])))


if __name__ == "__main__":
    main()
