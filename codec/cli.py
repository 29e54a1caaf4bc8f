"""`veil codec`: encode, decode, truncate, eval, bench and plot with an exported ARPC codec model.

Examples:
    veil codec encode photo.png -o photo.vc --target-bpp 0.02      # the shipped default model
    veil codec decode photo.vc -o photo.png
    veil codec truncate photo.vc --scales 6 -o photo6.vc
    veil codec eval heldout --scales 8
    veil codec bench heldout -o bench.json --model runs/codec      # a model of your own
    veil codec plot bench.json -o rd.png

``--model`` is an exported codec: a version folder holding codec.json, a model folder of the repository
(the latest version is used) or a `veil train codec` run folder (its ``repo/codec``). Without it the model
shipped in the package is used (``veil/codec/default``, see docs/codec.md). Every result names the model it
used. Results are JSON on stdout; progress and errors go to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from . import bitstream
from .errors import CodecError
from .images import MAX_PIXELS, MAX_WORK_MB, MIN_SIDE

EXAMPLE = """example:
  veil codec encode photo.png -o photo.vc --target-bpp 0.02
  veil codec decode photo.vc -o photo.png
  veil codec bench heldout --model runs/codec -o bench.json && veil codec plot bench.json -o rd.png
"""
# the default model shipped inside the package (a model repository holding one model, "codec")
SHIPPED_MODEL = Path(__file__).resolve().parent / "default" / "codec"
HOW_TO_TRAIN = ("train one: `veil train codec --out runs/codec` (the default recipe, about 15 minutes on one idle CPU "
                "thread, longer on a busy machine), or `veil train codec --quick --out runs/codec-quick` (under a "
                "minute: a small model that reconstructs its input, far below the default's quality), then pass "
                "--model runs/codec")


def resolve_model(path: Path) -> Path:
    """The version folder holding codec.json under a version, model or training-run folder."""
    if (path / "codec.json").is_file():
        return path
    versions = sorted((p for p in path.iterdir() if p.name.isdigit() and (p / "codec.json").is_file()),
                      key=lambda p: int(p.name)) if path.is_dir() else []
    if versions:
        return versions[-1]
    if (path / "repo" / "codec").is_dir():
        return resolve_model(path / "repo" / "codec")
    if (path / "model.safetensors").is_file():  # a `veil train codec --no-export` checkpoint
        how = f"export it: veil export codec {path} --repo {path / 'repo'} --name codec"
    else:
        how = (f"train and export one: veil train codec --out {path} (writes {path / 'repo' / 'codec' / '1'}; about "
               f"15 minutes on one idle CPU thread, or under a minute with --quick for a small model that "
               "reconstructs its input), or export a trained checkpoint: veil export codec CHECKPOINT --repo REPO --name codec")
    raise CodecError(f"--model {str(path)!r}: expected an exported codec (a folder with codec.json, a model folder "
                     f"of a repository, or a `veil train codec` run folder), found none; {how}")


def default_model(model: Path | None) -> tuple[Path, str]:
    """(version folder, where it came from): an explicit ``--model`` wins, else the shipped default."""
    if model is not None:
        return resolve_model(model), "--model"
    if not SHIPPED_MODEL.is_dir():
        raise CodecError(f"--model: not given, and the default model shipped with veil ({SHIPPED_MODEL}) is missing "
                         f"(an install without its package data?); {HOW_TO_TRAIN}")
    return resolve_model(SHIPPED_MODEL), "shipped default"


def _runtime(args: argparse.Namespace):
    from .runtime import CodecRuntime

    folder, source = default_model(args.model)
    runtime = CodecRuntime(folder, threads=args.threads, max_pixels=args.max_pixels, max_work_mb=args.max_work_mb)
    args.model_used = {"path": str(folder), "source": source, "hash": runtime.hash}
    return runtime


def _pixels(text: str) -> int:
    """argparse type of --max-pixels: an integer in [MIN_SIDE^2, MAX_PIXELS]."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not MIN_SIDE * MIN_SIDE <= value <= MAX_PIXELS:
        raise argparse.ArgumentTypeError(f"expected an integer in [{MIN_SIDE * MIN_SIDE}, {MAX_PIXELS}], "
                                         f"received {text!r}")
    return value


def _example(command: str) -> dict[str, object]:
    """A verb's ``--help`` epilog with its example (docs/cli.md: every verb has one)."""
    return {"epilog": f"example:\n  {command}\n", "formatter_class": argparse.RawDescriptionHelpFormatter}


def build_parser(prog: str = "veil codec") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0], epilog=EXAMPLE,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="{encode,decode,truncate,eval,bench,plot}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--model", type=Path, default=None,
                        help="exported codec: version, model or `veil train codec` run folder (default: the model "
                             "shipped with veil)")
    common.add_argument("--threads", type=int, default=1,
                        help="ONNX Runtime threads of the encoder/decoder (the prior always runs on one)")
    common.add_argument("--max-pixels", type=_pixels, default=MAX_PIXELS,
                        help=f"refuse images and streams claiming more pixels than this (default: {MAX_PIXELS}); "
                             "a stream sending few scales can claim a large image, and decoding costs its size")
    common.add_argument("--max-work-mb", type=float, default=MAX_WORK_MB,
                        help=f"refuse images and streams whose coding needs more memory than this (default: "
                             f"{MAX_WORK_MB:g} MiB, about 750x750 pixels; the prior attends over every latent cell, "
                             "so memory grows with the square of the area)")
    decoding = argparse.ArgumentParser(add_help=False)
    decoding.add_argument("--mode", choices=sorted(bitstream.MODES), default="greedy",
                          help="how the decoder fills the scales not sent (default: greedy)")
    decoding.add_argument("--seed", type=int, default=0, help="seed of the sampled mode (stored in the stream)")
    decoding.add_argument("--temperature", type=float, default=1.0, help="temperature of the sampled mode")
    rate = argparse.ArgumentParser(add_help=False)
    group = rate.add_mutually_exclusive_group()
    group.add_argument("--scales", type=int, default=None, help="scales to send, k (default: all)")
    group.add_argument("--target-bpp", type=float, default=None, help="send the most scales within this bpp")

    p = verbs.add_parser("encode", **_example("veil codec encode photo.png -o photo.vc --target-bpp 0.02"), parents=[common, decoding, rate], help="image -> bitstream")
    p.add_argument("image", type=Path)
    p.add_argument("-o", "--output", type=Path, required=True)
    p = verbs.add_parser("decode", **_example("veil codec decode photo.vc -o photo.png"), parents=[common], help="bitstream -> PNG")
    p.add_argument("stream", type=Path)
    p.add_argument("-o", "--output", type=Path, required=True)
    p = verbs.add_parser("truncate", **_example("veil codec truncate photo.vc --scales 4 -o photo4.vc"), help="cut a stream to its first k scales (no model, no re-encoding)")
    p.add_argument("stream", type=Path)
    p.add_argument("--scales", type=int, required=True)
    p.add_argument("-o", "--output", type=Path, required=True)
    p = verbs.add_parser("eval", **_example("veil codec eval heldout --target-bpp 0.05 --per-image"), parents=[common, decoding, rate], help="bpp, PSNR, MS-SSIM and times on a folder")
    p.add_argument("images", help="a folder of images, or 'heldout' (the bundled photos never trained on)")
    p.add_argument("--per-image", action="store_true", help="include every image's row")
    p = verbs.add_parser("bench", **_example("veil codec bench heldout --targets 0.02 0.05 -o bench.json"), parents=[common, decoding],
                         help="vs JPEG/WebP/AVIF at matched bpp (best quality x downscale)")
    p.add_argument("images", help="a folder of images, or 'heldout'")
    p.add_argument("--targets", type=float, nargs="+", default=[0.01, 0.02, 0.05, 0.1], help="bpp budgets")
    p.add_argument("--codecs", nargs="+", default=None, help="anchors (default: every one Pillow can write)")
    p.add_argument("-o", "--output", type=Path, default=None, help="also write the JSON here (input of `plot`)")
    p.add_argument("--no-progress", action="store_true", help="no progress on stderr (TQDM_DISABLE=1 also works)")
    p = verbs.add_parser("plot", **_example("veil codec plot bench.json -o rd.png"), help="rate-distortion curves of a bench JSON to PNG")
    p.add_argument("results", type=Path)
    p.add_argument("-o", "--output", type=Path, required=True)
    return parser


def run(args: argparse.Namespace) -> dict:
    from veil.atomic import write_atomic

    from .images import load_folder, load_image, png_bytes

    if args.verb == "encode":
        runtime = _runtime(args)
        start = time.perf_counter()
        enc = runtime.encode(load_image(args.image.read_bytes()), k=args.scales, target_bpp=args.target_bpp,
                             mode=args.mode, seed=args.seed, temperature=args.temperature)
        write_atomic(args.output, enc.data)
        return {"output": str(args.output), "bytes": len(enc.data), "bpp": enc.bpp, "scales": enc.k,
                "cross_entropy_bits": enc.cross_entropy_bits, "raw_bits": enc.raw_bits,
                "encoding_time": time.perf_counter() - start}
    if args.verb == "decode":
        runtime = _runtime(args)
        start = time.perf_counter()
        pixels = runtime.decode(args.stream.read_bytes())
        write_atomic(args.output, png_bytes(pixels))
        return {"output": str(args.output), "height": pixels.shape[0], "width": pixels.shape[1],
                "decoding_time": time.perf_counter() - start}
    if args.verb == "truncate":
        data = bitstream.truncate(args.stream.read_bytes(), args.scales)
        write_atomic(args.output, data)
        return {"output": str(args.output), "bytes": len(data), "scales": args.scales}
    if args.verb == "eval":
        from .evaluate import evaluate

        result = evaluate(_runtime(args), load_folder(args.images), k=args.scales, target_bpp=args.target_bpp,
                          mode=args.mode, seed=args.seed)
        return result if args.per_image else {k: v for k, v in result.items() if k != "images"}
    if args.verb == "bench":
        from .evaluate import bench, curve

        runtime, images = _runtime(args), load_folder(args.images)
        result = bench(runtime, images, args.targets, args.codecs, args.mode, progress=not args.no_progress)
        result["curve"] = [{k: v for k, v in c.items() if k != "images"}
                           for c in curve(runtime, images, args.mode, progress=not args.no_progress)]
        if args.output:
            write_atomic(args.output, json.dumps(result, indent=1))
        return result
    from .evaluate import plot

    return {"output": str(plot(json.loads(args.results.read_text()), args.output))}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        result = run(args)
    except (CodecError, OSError) as exc:
        print(f"veil codec {args.verb}: {exc}", file=sys.stderr)
        return 2
    used = getattr(args, "model_used", None)
    if used is not None:
        result = {"model": used, **result}
        print(f"veil codec {args.verb}: model {used['path']} ({used['source']}, hash {used['hash'][:12]})",
              file=sys.stderr)
    print(json.dumps(result, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
