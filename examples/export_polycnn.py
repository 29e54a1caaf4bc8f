"""Train a small PolyCNN on digits, export it to a Triton-layout model repository and run it with ONNX Runtime.

    python examples/export_polycnn.py --epochs 20 --repo runs/example-models
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import onnxruntime as ort
from veil.export import export_uldnet
from veil.training.uldnet import ModelConfig, TrainConfig, load_digits_preset, save_uldnet, train_uldnet


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--repo", type=Path, default=Path("runs/example-models"))
    parser.add_argument("--int8", action="store_true", help="also export a static-int8 copy")
    args = parser.parse_args()

    data = load_digits_preset()
    result = train_uldnet(ModelConfig(arch="cnn", input_shape=data.input_shape),
                          TrainConfig(epochs=args.epochs, warmup_epochs=min(5, args.epochs - 1)), data)
    checkpoint = args.repo.parent / "example-polycnn"
    save_uldnet(result, checkpoint, data)

    manifest = export_uldnet(checkpoint, args.repo, name="digits")  # validated against PyTorch, or it raises
    print(json.dumps({"validated_cases": len(manifest["validation"]["cases"]), "functions": manifest["export"]["veil_functions"]}))
    if args.int8:
        print(json.dumps(export_uldnet(checkpoint, args.repo, name="digits-int8", quantize="int8")["quantization"]))

    session = ort.InferenceSession(str(args.repo / "digits" / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    logits = session.run(["logits"], {"x": data.x_test})[0]
    print(f"ONNX Runtime test accuracy: {100 * float((logits.argmax(1) == data.y_test).mean()):.2f} %")


if __name__ == "__main__":
    main()
