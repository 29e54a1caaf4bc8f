"""The one `veil` command: `veil <group> <verb> [options]`.

Verbs are modules with ``build_parser()`` and ``main(argv) -> int`` (or ``"module:function"``, a function of the
same signature: `veil train codec` trains in veil.training and exports in veil.export, the front door composes
the two rooms); they are imported only when run, so `veil --help` stays fast and a client install never imports
torch.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from veil import __version__

# group -> (what it is for, {verb: module}, example)
GROUPS: dict[str, tuple[str, dict[str, str], str]] = {
    "train": ("train models from scratch", {"uldnet": "veil.training.uldnet.cli", "lm": "veil.training.lm.cli",
                                            "rl": "veil.training.rl.cli", "codec": "veil.export.codec_cli:train_main",
                                            "sampler": "veil.training.priorguide.cli",
                                            "forecast": "veil.training.forecast.cli"},
              "veil train uldnet --preset digits --arch cnn --out runs/polycnn"),
    "finetune": ("adapter fine-tuning: LoRA, PSOFT, mtLoRA, E2LoRA, LoRA-Mixer, VAPT", {"": "veil.training.adapters.cli"},
                 "veil finetune --method lora --model bundled:all-MiniLM-L6-v2 --task sentiment --out runs/lora"),
    "compress": ("compression: SAES-SVD, HEAPr, safety realignment", {"": "veil.training.compress.cli"},
                 "veil compress MODEL --recipe recipe.yaml --calibration DATA --out DIR"),
    "export": ("checkpoint -> ONNX in a Triton-layout model repository", {"onnx": "veil.export.cli", "he": "veil.export.he_cli",
                                                                             "adapters": "veil.export.adapters_cli",
                                                                             "finetuned": "veil.export.finetuned_cli",
                                                                             "codec": "veil.export.codec_cli",
                                                                             "sampler": "veil.export.sampler_cli",
                                                                             "forecast": "veil.export.forecast_cli"},
               "veil export onnx runs/polycnn --repo models --name digits"),
    "serve": ("serve a model repository over the Open Inference Protocol v2", {"": "veil.engine.cli"},
              "veil serve --repo models/ --port 8000"),
    "he": ("encrypted inference client: keygen, encrypt, infer, decrypt", {"": "veil.he.cli"},
           "veil he keygen --server http://127.0.0.1:8000 --model digits-he --keyring keys/digits.keyring"),
    "codec": ("ARPC image codec: encode, decode, truncate, eval, bench, plot", {"": "veil.codec.cli"},
              "veil codec encode photo.png -o photo.vc --model runs/codec --target-bpp 0.02"),
    "sample": ("PriorGuide posterior sampling with a prior chosen at sampling time", {"": "veil.posterior.cli"},
               "veil sample models/gl5 --x 0.1 0.2 --prior '{\"family\": \"gaussian\", \"mean\": [0, 0], \"std\": 0.3}'"),
    "recommend": ("which served model fits my few labelled examples (PAVE specs; --private: CKKS-encrypted)",
                  {"": "veil.recommend"}, "veil recommend --repo models --data few_shots.jsonl --private"),
    "cluster": ("k-clustering from a noisy quadruplet oracle (\"is d(a,b) <= d(c,d)?\")",
                {"": "veil.algorithms.cluster.cli"}, "veil cluster --data items.jsonl --k 5 --oracle noisy --phi 0.15"),
    "games": ("Nash equilibria: regret matching (RM+ .. MI-SPRM+), CFR on OpenSpiel games",
              {"solve": "veil.algorithms.games.cli", "cfr": "veil.algorithms.games.cfr_cli"},
              "veil games solve payoff.npy --algorithm mi-sprm+ --iterations 10000 --plot gap.png"),
    "env": ("where veil runs: versions, processor model and vector extensions (for bug reports and results)",
            {"": "veil.machine"}, "veil env --json"),
}

# group -> the extra that installs what it imports (`veil[client]`, the base install, runs only `veil he`)
EXTRAS = {"train": "train", "finetune": "train", "compress": "train", "export": "export", "serve": "serve",
          "codec": "codec", "sample": "train", "he": "client", "demo": "all",
          "cluster": "train", "games": "games", "recommend": "train", "env": "client"}

USAGE = f"""usage: veil <group> <verb> [options]      (veil <group> --help lists the verbs)

veil {__version__}: a privacy- and deployment-oriented inference engine.

groups:
{chr(10).join(f"  {name:<9} {desc}" for name, (desc, _, _) in GROUPS.items())}
  demo      train (or reuse) the digits PolyCNN and print a summary table

options:
  -h, --help     show this help
  --version      print the version

example:
  veil train uldnet --preset digits --arch cnn --out runs/polycnn
  veil demo
"""


def group_help(name: str) -> str:
    desc, verbs, example = GROUPS[name]
    lines = [f"usage: veil {name} <verb> [options]", "", f"veil {name}: {desc}", ""]
    lines += ["verbs:"] + [f"  {verb:<9} (veil {name} {verb} --help)" for verb in verbs]
    return "\n".join([*lines, "", "example:", f"  {example}", ""])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    from veil.progress import quiet_library_bars

    quiet_library_bars()  # in a log, Hugging Face's own tqdm bars would write \r updates (veil/progress.py)
    if not argv or argv[0] in ("-h", "--help"):  # bare `veil` is a request for help, as bare `pip` is
        print(USAGE)
        return 0
    if argv[0] == "--version":
        print(f"veil {__version__}")
        return 0
    group, rest = argv[0], argv[1:]
    if group == "demo":
        from veil.demo import main as demo_main

        return run_verb("veil demo", lambda: demo_main(rest))
    if group not in GROUPS:
        print(f"veil: unknown group {group!r}; expected one of {[*GROUPS, 'demo']}", file=sys.stderr)
        return 2
    verbs = GROUPS[group][1]
    if "" in verbs:  # a group that is one command (`veil serve --repo DIR`)
        return run_verb(f"veil {group}", lambda: verb_main(verbs[""])(rest))
    if not rest or rest[0] in ("-h", "--help"):
        print(group_help(group))
        return 0
    if rest[0] not in verbs:
        print(f"veil {group}: unknown verb {rest[0]!r}; expected {sorted(verbs)}", file=sys.stderr)
        return 2
    return run_verb(f"veil {group} {rest[0]}", lambda: verb_main(verbs[rest[0]])(rest[1:]))


def verb_main(target: str) -> Callable[[list[str]], int]:
    """The ``main(argv) -> int`` a verb table entry names: ``"module"`` (its ``main``) or ``"module:function"``."""
    from veil.lazy import import_object

    return import_object(target, default="main")


def run_verb(name: str, call) -> int:
    """Run a verb; bad input (ValueError, missing file) becomes one line on stderr and exit status 2, and
    argparse's exits (``--help``: 0, a usage error: 2) become the returned status. A third-party package the
    install lacks (a client install running `veil serve`) names the extra that brings it, status 2.

    Set VEIL_DEBUG=1 to see the traceback instead.
    """
    try:
        return call()
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    except ModuleNotFoundError as exc:
        package = (exc.name or "").partition(".")[0]
        extra = EXTRAS.get(name.split()[1], "all")  # name: "veil <group> [verb]"
        if not package or package == "veil" or os.environ.get("VEIL_DEBUG"):
            raise
        print(f"{name}: error: needs the package {package!r}, which this install lacks; "
              f"install it with: pip install 'veil[{extra}]'", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError) as exc:
        if os.environ.get("VEIL_DEBUG"):
            raise
        print(f"{name}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
