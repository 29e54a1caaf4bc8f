"""Train a PolyResNet on 32x32 RGB photos (photos32 or your own folder), export it to ONNX, check ONNX Runtime parity.

    python examples/uldnet_photos32.py                                      # the photos32 ResNet-20 recipe (~45 min, 2 cores)
    python examples/uldnet_photos32.py --width 8 --depth 1 --epochs 5       # a small PolyResNet-8 (minutes)
    python examples/uldnet_photos32.py --data folder:photos/ --epochs 15    # photos/<class>/*.png|jpg, resized to 32x32

The recipe is ``PHOTOS32_PRESETS["resnet"]`` (training/uldnet/config.py: lr 3e-3, PolyNorm's training fallback,
the variance penalty in warm-up); ``--width`` / ``--depth`` / ``--epochs`` override it. The exported model records
its input contract (what ``x`` must be before it is sent), which this script prints from the ONNX file itself.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from veil.export import export_uldnet
from veil.training.uldnet import (
    ModelConfig,
    TrainConfig,
    load_data_spec,
    load_photos32,
    load_uldnet,
    save_uldnet,
    train_uldnet,
)
from veil.training.uldnet.config import PHOTOS32_PRESETS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="photos32", help="photos32 (bundled), folder:DIR, cifar10:DIR or cifar100:DIR")
    parser.add_argument("--width", type=int, default=16, help="channels of the first stage (x2, x4 after)")
    parser.add_argument("--depth", type=int, default=3, help="blocks per stage (6n + 2 layers; 3: ResNet-20)")
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train-size", type=int, default=0, help="train on this many training images, spread over "
                        "the classes (0: all; a quick try-out)")
    parser.add_argument("--workdir", type=Path, default=Path("runs/example-photos32"))
    args = parser.parse_args()

    data = load_photos32() if args.data == "photos32" else load_data_spec(args.data, image_size=32)
    if args.train_size:  # every k-th image: the splits are stored class by class, so this keeps every class
        keep = np.linspace(0, len(data.y_train) - 1, args.train_size).round().astype(int)
        data = dataclasses.replace(data, x_train=data.x_train[keep], y_train=data.y_train[keep])
    print(data.source, f"{len(data.classes)} classes,", json.dumps(data.describe()["sizes"]))
    recipe = PHOTOS32_PRESETS["resnet"]
    model_config = ModelConfig.from_dict({**recipe["model"], "input_shape": data.input_shape,
                                          "num_classes": len(data.classes), "width": args.width, "depth": args.depth})
    warmup = min(recipe["train"]["warmup_epochs"], args.epochs - 1)  # epochs of exact LayerNorm before PolyNorm
    train_config = TrainConfig(**{**recipe["train"], "epochs": args.epochs, "warmup_epochs": warmup, "seed": args.seed})
    result = train_uldnet(model_config, train_config, data)
    checkpoint = save_uldnet(result, args.workdir / "checkpoint", data)
    print(f"PolyResNet width {args.width}, {args.depth} blocks per stage: {result.metrics['depth_total']} levels, "
          f"test accuracy: {100 * result.metrics['test_accuracy']:.2f} %")

    manifest = export_uldnet(checkpoint, args.workdir / "models", name="photos32")  # validated against PyTorch
    session = ort.InferenceSession(str(args.workdir / "models" / "photos32" / "1" / "model.onnx"),
                                   providers=["CPUExecutionProvider"])
    contract = json.loads(session.get_modelmeta().custom_metadata_map["veil.input"])  # travels in the ONNX file
    print("input contract:", json.dumps(contract))
    assert contract == manifest["input"]

    model, _ = load_uldnet(checkpoint)
    with torch.no_grad():
        expected = model(torch.from_numpy(data.x_test)).numpy()  # (N, classes)
    logits = session.run(["logits"], {"x": data.x_test})[0]
    # an image far outside the training data can take a stacked polynomial past float32 (inf / NaN) in both
    # runtimes alike; parity is checked on the other rows and the overflowing ones are counted
    finite = np.isfinite(expected).all(1)
    if not np.array_equal(finite, np.isfinite(logits).all(1)):
        raise SystemExit("ONNX Runtime and PyTorch disagree on which test images overflow float32")
    scale = np.maximum(1.0, np.abs(expected[finite]).max(1, keepdims=True))
    err = float((np.abs(logits[finite] - expected[finite]) / scale).max())
    agree = float((logits.argmax(1) == expected.argmax(1))[finite].mean())
    print(f"ONNX Runtime test accuracy: {100 * float((logits.argmax(1) == data.y_test).mean()):.2f} %; argmax "
          f"agreement with PyTorch {100 * agree:.2f} %, max relative logit error {err:.1e}; "
          f"{int((~finite).sum())} of {len(finite)} test images overflow float32 in both")
    if err > 1e-3:
        raise SystemExit(f"ONNX Runtime and PyTorch disagree: max relative logit error {err:.1e} > 1e-3")


if __name__ == "__main__":
    main()
