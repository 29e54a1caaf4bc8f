"""Train a fully polynomial PolyCNN (ULD-Net) on the bundled digits and print its accuracy and CKKS depth.

    python examples/train_polycnn_digits.py --epochs 40 --out runs/example-polycnn
"""

from __future__ import annotations

import argparse

from veil.training.uldnet import (
    ModelConfig,
    TrainConfig,
    load_digits_preset,
    load_uldnet,
    multiplicative_depth,
    save_uldnet,
    train_uldnet,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--warmup-epochs", type=int, default=5)
    parser.add_argument("--out", default="runs/example-polycnn")
    args = parser.parse_args()

    data = load_digits_preset()  # (N, 1, 8, 8) in [0, 1], fixed stratified split
    model_config = ModelConfig(arch="cnn", input_shape=data.input_shape, num_classes=len(data.classes))
    train_config = TrainConfig(epochs=args.epochs, warmup_epochs=args.warmup_epochs, seed=0)
    result = train_uldnet(model_config, train_config, data)
    save_uldnet(result, args.out, data)

    model, _ = load_uldnet(args.out)  # what an exporter would load
    print(multiplicative_depth(model).table())
    print(f"test accuracy: {100 * result.metrics['test_accuracy']:.2f} %  (checkpoint: {args.out})")


if __name__ == "__main__":
    main()
