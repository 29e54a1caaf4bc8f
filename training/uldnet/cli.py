"""`veil train uldnet`: train a fully polynomial ULD-Net model (and, on request, its standard-op baseline).

Examples:
    veil train uldnet --preset digits --arch cnn --out runs/polycnn
    veil train uldnet --preset photos32 --arch resnet --out runs/resnet20   # 32x32 RGB, PolyResNet-20
    veil train uldnet --data cifar10:~/data/cifar-10-batches-py --arch resnet --out runs/cifar
    veil train uldnet --data folder:my_photos/ --arch vit --baseline        # the LayerNorm + GELU twin
    veil train uldnet --preset digits-he --arch cnn --out runs/polycnn-he   # fits leveled CKKS (8 levels)
    veil train uldnet --data my.npz --arch mlp --width 128 --depth 2 --epochs 30 --out runs/mlp
    veil train uldnet --image-folder photos/ --image-size 16 --arch cnn --compare-baseline
    torchrun --nproc_per_node 2 $(which veil) train uldnet --preset digits --out runs/polycnn   # DDP, same result
    veil train uldnet --preset digits --arch cnn --lr-range --out runs/lr-range   # which lr trains (no checkpoint)

Results (metrics JSON) go to stdout; the progress bar goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from veil.config import Config, ConfigError

from .config import (
    ARCH_RECIPES,
    DEFAULT_ARCH,
    DIGITS_HE_PRESETS,
    DIGITS_PRESETS,
    PHOTOS32_PRESETS,
    ModelConfig,
    PolyActConfig,
    PolyNormConfig,
    TrainConfig,
)
from .data import Splits

EXAMPLE = """example:
  veil train uldnet --preset digits --arch cnn --out runs/polycnn
  veil train uldnet --preset digits-he --arch cnn --out runs/polycnn-he
  veil train uldnet --preset photos32 --arch resnet --out runs/resnet20
  veil train uldnet --data cifar10:cifar-10-batches-py --arch resnet --compare-baseline
  veil train uldnet --data folder:photos/ --arch vit --epochs 30
  veil train uldnet --data my.npz --arch mlp --width 128 --epochs 30 --compare-baseline
  veil train uldnet --preset digits --arch cnn --lr-range --lr-range-steps 100 --out runs/lr-range
"""


# --preset -> the per-family recipes over a bundled dataset
PRESETS: dict[str, dict[str, dict[str, dict]]] = {"digits": DIGITS_PRESETS, "digits-he": DIGITS_HE_PRESETS,
                                                  "photos32": PHOTOS32_PRESETS}
# flag prefix of each config's fields, for error messages that name the flag
FLAG_PREFIX: dict[type[Config], str] = {ModelConfig: "", TrainConfig: "", PolyNormConfig: "norm-", PolyActConfig: "act-"}


def build_parser(prog: str = "veil train uldnet") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0], epilog=EXAMPLE,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--preset", choices=list(PRESETS), default=None,
                        help="bundled dataset and recipe (default: digits); digits-he: a model whose encrypted plan "
                             "fits one leveled 128-bit CKKS parameter set (mlp or cnn)")
    source.add_argument("--data", metavar="KIND:PATH",
                        help="your data: folder:DIR (one sub-folder per class, PNG/JPEG, RGB, resized to "
                             "--image-size), cifar10:DIR / cifar100:DIR (the python-pickle batch files of the "
                             "official archives), npz:FILE or FILE.npz (arrays x (N, ...) and y (N,))")
    source.add_argument("--image-folder", type=Path, help="folder of class sub-folders of images (grey unless --rgb)")
    parser.add_argument("--image-size", type=int, default=None,
                        help="resize images to this size (default: 32 with --data folder:, 8 with --image-folder)")
    parser.add_argument("--rgb", action="store_true", help="keep 3 colour channels (with --image-folder)")
    parser.add_argument("--out", type=Path, default=None, help="checkpoint folder (default: runs/uldnet-<arch>)")
    parser.add_argument("--config", type=Path, default=None,
                        help="start from a JSON file with 'model' and 'train' objects (e.g. a checkpoint's config.json)")
    parser.add_argument("--compare-baseline", action="store_true",
                        help="also train the same network with standard ops and record its accuracy")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    lr_range = parser.add_argument_group("learning-rate range check (--lr-range; training/uldnet/lr_range.py)")
    lr_range.add_argument("--lr-range", action="store_true",
                          help="instead of training, sweep the lr geometrically over a few steps, stop when the "
                               "loss diverges and print the stable range; writes OUT/lr_range.json (+ .png)")
    lr_range.add_argument("--lr-range-steps", type=int, default=100, help="optimizer steps of the sweep (default 100)")
    lr_range.add_argument("--lr-range-min", type=float, default=1e-5, help="first lr of the sweep (default 1e-5)")
    lr_range.add_argument("--lr-range-max", type=float, default=1.0, help="last lr of the sweep (default 1)")
    ModelConfig.add_arguments(parser, skip=("input_shape", "num_classes"))
    PolyNormConfig.add_arguments(parser, prefix="norm-")
    PolyActConfig.add_arguments(parser, prefix="act-")
    TrainConfig.add_arguments(parser)
    return parser


def load_data(args: argparse.Namespace) -> Splits:
    from .data import load_data_spec, load_digits_preset, load_image_folder

    if args.data is not None:
        return load_data_spec(args.data, image_size=args.image_size or 32)
    if args.image_folder is not None:
        return load_image_folder(args.image_folder, args.image_size or 8, grayscale=not args.rgb)
    if args.preset == "photos32":
        from .photos import load_photos32

        return load_photos32()
    return load_digits_preset()


def name_flags(message: str) -> str:
    """Rewrite ``TrainConfig.warmup_epochs`` in a config error as the flag the user typed (``--warmup-epochs``)."""
    def flag(match: re.Match) -> str:
        cls = next(c for c in FLAG_PREFIX if c.__name__ == match[1])
        return "--" + (FLAG_PREFIX[cls] + match[2]).replace("_", "-")

    pattern = r"\b(" + "|".join(c.__name__ for c in FLAG_PREFIX) + r")\.([a-z_0-9]+)"
    return re.sub(pattern, flag, message)


def configs_from_args(args: argparse.Namespace, data: Splits) -> tuple[ModelConfig, TrainConfig]:
    """Defaults, then the preset's recipe of the family (bundled data), the family's recipe (your data) or
    --config, then the flags. A bad value is reported under the flag's name."""
    arch = args.arch or DEFAULT_ARCH.get(args.preset or "digits", "cnn")
    if args.config:
        base = json.loads(args.config.read_text())
    elif args.data is None and args.image_folder is None:
        presets = PRESETS[args.preset or "digits"]
        if arch not in presets:
            raise ConfigError(f"--arch: preset {args.preset!r} has recipes for {sorted(presets)}, received {arch!r}")
        base = presets[arch]
    else:
        base = ARCH_RECIPES.get(arch, {})
    model_base = {**base.get("model", {}), **({} if args.arch or args.config else {"arch": arch})}
    try:
        norm = PolyNormConfig.from_args(args, prefix="norm-", base=model_base.pop("norm", None))
        act = PolyActConfig.from_args(args, prefix="act-", base=model_base.pop("act", None))
        model = ModelConfig.from_args(args, base=model_base, input_shape=data.input_shape,
                                      num_classes=len(data.classes), norm=norm, act=act)
        return model, TrainConfig.from_args(args, base=base.get("train"))
    except ConfigError as exc:
        raise ConfigError(name_flags(str(exc))) from exc


def run_lr_range(args: argparse.Namespace) -> int:
    """`--lr-range`: the range check of the selected model (and of its baseline with --compare-baseline);
    the table goes to stdout, the curves to OUT/lr_range.json (+ lr_range.png), no checkpoint."""
    from .lr_range import lr_range_test, save_lr_range

    data = load_data(args)
    model_config, train_config = configs_from_args(args, data)
    out = args.out or Path("runs") / f"lr-range-{model_config.arch}{'-baseline' if model_config.baseline else ''}"
    configs = [("", model_config)]
    if args.compare_baseline and not model_config.baseline:
        configs.append(("_baseline", model_config.replace(baseline=True)))
    for suffix, config in configs:
        result = lr_range_test(config, train_config, data, lr_min=args.lr_range_min, lr_max=args.lr_range_max,
                               steps=args.lr_range_steps, progress=not args.no_progress)
        written = save_lr_range(result, out, {"model": config.to_dict(), "train": train_config.to_dict(),
                                              "data": data.describe()}, name=f"lr_range{suffix}")
        print(result.table())
        print("  written".ljust(32), ", ".join(written.values()))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # before torch: --help and usage errors stay instant
    if args.lr_range:
        if args.lr_range_steps < 2:
            raise ConfigError(f"--lr-range-steps: expected >= 2, received {args.lr_range_steps}")
        if not 0 < args.lr_range_min < args.lr_range_max:
            raise ConfigError(f"--lr-range-min/--lr-range-max: expected 0 < min < max, received "
                              f"{args.lr_range_min}, {args.lr_range_max}")
        return run_lr_range(args)
    from .. import distributed
    from .trainer import save_uldnet, train_uldnet

    distributed.setup()  # under torchrun: DDP over --nproc_per_node processes (training/distributed.py)
    data = load_data(args)
    model_config, train_config = configs_from_args(args, data)
    out = args.out or Path("runs") / f"uldnet-{model_config.arch}{'-baseline' if model_config.baseline else ''}"
    result = train_uldnet(model_config, train_config, data, progress=not args.no_progress)
    extra = {}
    if args.compare_baseline and not model_config.baseline:
        baseline = train_uldnet(model_config.replace(baseline=True), train_config, data, progress=not args.no_progress)
        extra["baseline"] = {k: baseline.metrics[k] for k in ("test_accuracy", "val_accuracy", "train_seconds", "parameters")}
    if distributed.is_main():  # one checkpoint and one report per job
        save_uldnet(result, out, data, extra)
        print(json.dumps({"checkpoint": str(out), **result.metrics, **extra}, indent=2))
    distributed.teardown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
