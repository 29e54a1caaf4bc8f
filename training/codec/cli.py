"""`veil train codec`: train the tiny ARPC codec (tokenizer, then prior) and export it for `veil codec`.

By default it trains on the bundled ``skimage.data`` photos except the held-out astronaut, coffee and chelsea
(and ``cat``, the same photo as chelsea), which `veil codec eval heldout` / `bench heldout` measure on.

Examples:
    veil train codec --out runs/codec
    veil train codec --quick --out runs/codec-quick
    veil train codec --images my_photos/ --tokenizer-steps 4000 --out runs/codec-mine
    veil codec encode photo.png -o photo.vc --model runs/codec --target-bpp 0.02

Writes the checkpoint to OUT and the exported model to OUT/repo/codec/1 (servable: `veil serve --repo
OUT/repo`). Metrics JSON goes to stdout; the progress bars to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .config import QUICK_MODEL, QUICK_TRAIN, CodecModelConfig, CodecTrainConfig

EXAMPLE = """example:
  veil train codec --out runs/codec                 # the default recipe (about 15 min on 1 idle thread)
  veil train codec --quick --out runs/codec-quick   # under a minute: a small model that reconstructs its input
  veil train codec --images my_photos/ --tokenizer-steps 4000 --out runs/codec-mine
"""


def build_parser(prog: str = "veil train codec") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0], epilog=EXAMPLE,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=Path, default=None,
                        help="train on this folder of images (default: the bundled skimage photos, held-out ones excluded)")
    parser.add_argument("--out", type=Path, default=Path("runs/codec"), help="run folder (default: runs/codec)")
    parser.add_argument("--no-export", action="store_true", help="only write the checkpoint")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    parser.add_argument("--quick", action="store_true",
                        help="a narrow model and a short schedule (under a minute on one thread; flags given beside it win)")
    parser.add_argument("--tokenizer-from", type=Path, default=None,
                        help="skip stage 1: train only the prior on this codec checkpoint's tokenizer (e.g. OUT/last "
                             "of a stopped run)")
    CodecModelConfig.add_arguments(parser)
    CodecTrainConfig.add_arguments(parser)
    return parser


def main(argv: list[str] | None = None, export: Callable[[Path], dict[str, Any]] | None = None) -> int:
    """Train and save the run; ``export(run) -> summary fields`` then exports it unless ``--no-export``.

    `veil train codec` passes veil.export's (:func:`veil.export.codec_cli.export_run`): training never imports
    export (ARCHITECTURE.md, "Data flows one way"), the front door composes the two.
    """
    args = build_parser().parse_args(argv)  # before torch: --help and usage errors stay instant
    from veil.codec.images import load_folder

    from .data import skimage_images
    from .trainer import load_codec, save_codec, train_codec

    tokenizer = None
    if args.tokenizer_from is not None:
        tokenizer, _, config = load_codec(args.tokenizer_from)
        model_config = CodecModelConfig.from_dict(config["model"])
    else:
        model_config = CodecModelConfig.from_args(args, base=QUICK_MODEL if args.quick else None)
    train_config = CodecTrainConfig.from_args(args, base=QUICK_TRAIN if args.quick else None)
    images = load_folder(args.images) if args.images is not None else skimage_images()
    names = sorted(images)
    result = train_codec(model_config, train_config, list(images.values()), progress=not args.no_progress,
                         checkpoint=lambda partial: save_codec(partial, args.out / "last", names),
                         tokenizer=tokenizer)
    save_codec(result, args.out, names)
    summary = {"checkpoint": str(args.out), **result.metrics}
    if export is not None and not args.no_export:
        summary |= export(args.out)
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
