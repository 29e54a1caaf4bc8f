"""Train a polynomial network on your own data: an .npz file (arrays x, y) or a folder of class folders.

    python examples/train_uldnet_own_data.py --npz features.npz --arch mlp
    python examples/train_uldnet_own_data.py --image-folder photos/ --image-size 16 --arch cnn
"""

from __future__ import annotations

import argparse

from veil.training.uldnet import ModelConfig, TrainConfig, load_image_folder, load_npz, train_uldnet


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--npz", help="file with x (N, ...) and y (N,)")
    source.add_argument("--image-folder", help="root/<class>/<image files>")
    parser.add_argument("--image-size", type=int, default=16)
    parser.add_argument("--arch", choices=["mlp", "cnn", "vit"], default="mlp")
    parser.add_argument("--epochs", type=int, default=30)
    args = parser.parse_args()

    data = load_npz(args.npz) if args.npz else load_image_folder(args.image_folder, args.image_size)
    print(data.describe())
    model_config = ModelConfig(arch=args.arch, input_shape=data.input_shape, num_classes=len(data.classes), width=32)
    warmup = min(5, args.epochs - 1)
    result = train_uldnet(model_config, TrainConfig(epochs=args.epochs, warmup_epochs=warmup), data)
    print({k: result.metrics[k] for k in ("test_accuracy", "depth_total", "parameters")})


if __name__ == "__main__":
    main()
