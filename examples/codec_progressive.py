"""One stream, every rate: encode a held-out photo once, cut the stream at each scale, decode each cut.

    python examples/codec_progressive.py --model runs/codec            # the model `veil train codec` exported
    python examples/codec_progressive.py --train-steps 40 --out /tmp/p  # no model yet: train a tiny one first

Prints bytes, bpp, PSNR and MS-SSIM for k = 1..K scales; the k-scale stream is a byte cut of the full one
(no re-encoding), which is what a proxy on a slow link would do. Writes the decoded PNGs to --out.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from veil.codec import bitstream
from veil.codec.cli import resolve_model
from veil.codec.images import bundled, png_bytes
from veil.codec.metrics import ms_ssim, psnr
from veil.codec.runtime import CodecRuntime


def tiny_model(out: Path, steps: int) -> Path:
    """Train and export a small codec on two bundled photos (never the held-out ones)."""
    from veil.export.codec import export_codec
    from veil.training.codec.config import CodecModelConfig, CodecTrainConfig
    from veil.training.codec.data import skimage_images
    from veil.training.codec.trainer import save_codec, train_codec

    images = skimage_images(("rocket", "camera"))
    model = CodecModelConfig(channels=[16, 32, 32, 32], prior_width=32, prior_layers=1, prior_heads=2)
    train = CodecTrainConfig(tokenizer_steps=steps, prior_steps=steps, crop=64, prior_crop=128, batch_size=4,
                             prior_crops=16)
    save_codec(train_codec(model, train, list(images.values()), progress=False), out / "ck", sorted(images))
    export_codec(out / "ck", out / "repo", "codec")
    return out / "repo" / "codec" / "1"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="an exported codec (default: train a tiny one)")
    parser.add_argument("--train-steps", type=int, default=40, help="steps per stage when training a tiny model")
    parser.add_argument("--image", default="astronaut", help="a held-out bundled photo: astronaut, coffee or chelsea")
    parser.add_argument("--out", type=Path, default=Path("runs/codec-progressive"), help="decoded PNGs go here")
    args = parser.parse_args()
    folder = resolve_model(args.model) if args.model else tiny_model(args.out, args.train_steps)
    runtime = CodecRuntime(folder)
    pixels = bundled((args.image,))[args.image]
    full = runtime.encode(pixels).data  # all K scales, once
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"{args.image} {pixels.shape[0]}x{pixels.shape[1]}, model {runtime.hash[:12]}")
    print(" k   bytes      bpp   PSNR  MS-SSIM")
    for k in range(1, runtime.geo.K + 1):
        data = bitstream.truncate(full, k)
        decoded = runtime.decode(data)
        (args.out / f"{args.image}_k{k}.png").write_bytes(png_bytes(decoded))
        bpp = len(data) * 8 / (pixels.shape[0] * pixels.shape[1])
        print(f"{k:2d} {len(data):7d} {bpp:8.4f} {psnr(pixels, decoded):6.2f} {ms_ssim(pixels, decoded):8.4f}")
    assert np.array_equal(runtime.decode(full), runtime.decode(bitstream.truncate(full, runtime.geo.K)))


if __name__ == "__main__":
    main()
