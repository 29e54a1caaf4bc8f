"""Encrypted CNNs side by side in one run: TenSEAL's tutorial CNN vs veil on the same CNN vs veil's digits-he PolyCNN.

(a) TenSEAL Tutorial 4 ("Encrypted Convolution on MNIST"), written from the tutorial and scaled to the 8x8 digits:
    conv 1 -> 4 channels, kernel 3, stride 1 (the tutorial's 7x7 / stride 3 on 28x28 leaves 8x8 windows; on 8x8
    inputs kernel 3 / stride 1 keeps one conv, 4 channels and a non-trivial first `mm`: 6x6 windows, 144 features)
    via ``ts.im2col_encoding`` + ``conv2d_im2col`` + bias, ``pack_vectors``, square, ``mm`` 144 -> 64 + bias,
    square, ``mm`` 64 -> 10 + bias; N = 8192, chain [31, 26 x 6, 31], scale 2^26, ``generate_galois_keys()``;
    trained in torch on the digits split (Adam 1e-3, batch 64, as the tutorial; more epochs: digits is small).
(b) the same torch model exported with ``veil.export`` and compiled by ``veil.he`` (latency layouts, masked
    diagonals, BSGS), at the tutorial's N = 8192 (the most precision bits that still fit it), with every
    rotation-key setting of the compiler: "exact", "budget:K" and "pow2" (the key-bytes / latency curve).
(c) veil's ``digits-he`` PolyCNN (``veil train uldnet --preset digits-he --arch cnn``), compiled the same way.

Single thread (TenSEAL ``n_threads=1``; SEAL is single-threaded), one process, server time only (no encryption
or decryption). Latency mode: plaintext/encrypted accuracy, agreement and logit error on the first test images,
server s/image for 1 image and per image for a batch of 8; throughput mode: the whole test split in one call.

    .venv/bin/python benchmarks/he_cnn.py            # full run: docs/results/he_cnn.json, results.md, img/he_cnn_keys.png
    .venv/bin/python benchmarks/he_cnn.py --quick    # smoke run (short training, few images, no PolyCNN throughput)
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import tenseal as ts
import torch
from torch import nn
from veil.export import export_graph
from veil.he.compile import compile as he_compile
from veil.he.evaluate import PlanEvaluator
from veil.he.keys import SecretKeyring
from veil.he.packing import pow2_steps
from veil.he.serialize import seal_to_bytes
from veil.training.uldnet import ModelConfig, TrainConfig, load_digits_preset, train_uldnet
from veil.training.uldnet.config import DIGITS_HE_PRESETS

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import argument_parser, command_line, environment, save_figure, save_results

TUTORIAL_N, TUTORIAL_CHAIN = 8192, [31] + [26] * 6 + [31]
KERNEL, STRIDE, CHANNELS, HIDDEN = 3, 1, 4, 64


class TutorialCNN(nn.Module):
    """Tutorial 4's ConvNet on 8x8 inputs: conv -> x^2 -> fc -> x^2 -> fc."""

    def __init__(self) -> None:
        super().__init__()
        side = (8 - KERNEL) // STRIDE + 1
        self.conv1 = nn.Conv2d(1, CHANNELS, KERNEL, stride=STRIDE)
        self.fc1 = nn.Linear(CHANNELS * side * side, HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, 10)

    def forward(self, x):  # (B, 1, 8, 8) -> (B, 10)
        x = self.conv1(x)
        x = (x * x).flatten(1)  # (B, C * windows), channel-major like pack_vectors
        x = self.fc1(x)
        return self.fc2(x * x)


def train_tutorial(data, epochs: int, seed: int = 73) -> TutorialCNN:
    """The tutorial's training loop (Adam 1e-3, batch 64, cross-entropy; seed 73 as in the notebook)."""
    torch.manual_seed(seed)
    model = TutorialCNN()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.as_tensor(data.x_train), torch.as_tensor(data.y_train)
    for _ in range(epochs):
        for idx in torch.randperm(len(x)).split(64):
            loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return model.eval()


def onnx_of(model: nn.Module):
    """The veil.export ONNX graph of ``model`` and its ONNX Runtime session."""
    graph = export_graph(model, (torch.randn(4, 1, 8, 8),), ["x"], ["logits"], {"x": {0: "batch"}}).model
    return graph, ort.InferenceSession(graph.SerializeToString())


def tenseal_rotations(slots: int) -> dict[str, int]:
    """Rotations of one (a) inference, counted from TenSEAL's algorithms (he.md §2.1): each im2col conv sums
    log2(kernel taps, padded) rotations, ``pack_vectors`` one per extra channel, each ``mm`` one per input row;
    SEAL does a step without its own key as the signed powers of two of its non-adjacent form."""
    windows = ((8 - KERNEL) // STRIDE + 1) ** 2
    conv = [windows << k for k in range(math.ceil(math.log2(KERNEL * KERNEL)))] * CHANNELS
    pack = [-windows * c for c in range(1, CHANNELS)]
    mm = list(range(1, CHANNELS * windows)) + list(range(1, HIDDEN))
    steps = conv + pack + mm
    return {"rotations": len(steps), "key_switches": sum(len(pow2_steps(s, slots)) for s in steps)}


def run_tenseal(model: TutorialCNN, x: np.ndarray) -> dict:
    """(a): the tutorial recipe on each image of ``x`` (no multi-image packing in TenSEAL: a batch is a loop)."""
    ctx = ts.context(ts.SCHEME_TYPE.CKKS, TUTORIAL_N, coeff_mod_bit_sizes=TUTORIAL_CHAIN, n_threads=1)
    ctx.global_scale = 2.0 ** TUTORIAL_CHAIN[1]
    start = time.perf_counter()
    ctx.generate_galois_keys()
    keygen = time.perf_counter() - start
    public = ctx.copy()
    public.make_context_public()
    key_bytes = len(public.serialize(save_public_key=False, save_galois_keys=True, save_relin_keys=True))
    kernels = model.conv1.weight.data.view(CHANNELS, KERNEL, KERNEL).tolist()
    conv_b = model.conv1.bias.data.tolist()
    w1, b1 = model.fc1.weight.T.data.tolist(), model.fc1.bias.data.tolist()
    w2, b2 = model.fc2.weight.T.data.tolist(), model.fc2.bias.data.tolist()
    logits, seconds = [], []
    for image in x[:, 0]:
        enc, windows = ts.im2col_encoding(ctx, image.tolist(), KERNEL, KERNEL, STRIDE)
        start = time.perf_counter()
        y = ts.CKKSVector.pack_vectors([enc.conv2d_im2col(k, windows) + b for k, b in zip(kernels, conv_b, strict=True)])
        y.square_()
        y = y.mm(w1) + b1
        y.square_()
        y = y.mm(w2) + b2
        seconds.append(time.perf_counter() - start)
        request, response = len(enc.serialize()), len(y.serialize())
        logits.append(y.decrypt())
    per = float(np.median(seconds))
    batch = min(8, len(seconds))
    return {"logits": np.array(logits), "server_s_1_image": per, "server_s_per_image_batch8": sum(seconds[:batch]) / batch,
            "images_per_s_throughput": 1.0 / per, "keygen_s": keygen, "eval_key_bytes": key_bytes,
            "request_bytes": request, "response_bytes": response, "poly_modulus_degree": TUTORIAL_N,
            "coeff_mod_bit_sizes": TUTORIAL_CHAIN, "levels": len(TUTORIAL_CHAIN) - 2,
            **tenseal_rotations(TUTORIAL_N // 2), "galois_keys": "generate_galois_keys() (TenSEAL default)",
            "batch8_note": "8 sequential calls (TenSEAL packs one image per ciphertext)", "images": len(x)}


def fitting_precision(graph, poly_modulus_degree: int) -> int:
    """The most precision bits (20 down to 10) for which the plan still runs at ``poly_modulus_degree``."""
    for bits in range(20, 9, -1):
        if he_compile(graph, mode="latency", precision_bits=bits).parameters().poly_modulus_degree <= poly_modulus_degree:
            return bits
    raise ValueError(f"fitting_precision: no precision in 10..20 bits fits N={poly_modulus_degree}")


def run_latency(graph, x: np.ndarray, rotation_keys: str, precision_bits: int, singles: int) -> dict:
    """veil latency mode: 1-image calls (median of ``singles``), one batch-of-8 call, then all of ``x`` packed."""
    plan = he_compile(graph, mode="latency", precision_bits=precision_bits, rotation_keys=rotation_keys)
    params = plan.parameters()
    start = time.perf_counter()
    ring = SecretKeyring.generate(params, plan.galois_steps)
    keys = ring.evaluation_keys()
    keygen = time.perf_counter() - start
    evaluator = PlanEvaluator(plan, params)

    def call(images: np.ndarray) -> tuple[list, float]:
        cts = ring.encrypt(plan.encode_inputs(images))
        start = time.perf_counter()
        outs = evaluator.run(cts, keys)
        return outs, time.perf_counter() - start

    single = float(np.median([call(x[i:i + 1])[1] for i in range(singles)]))
    outs, batch_s = call(x[:8])
    if len(x) > 8:  # the whole of x packed (the batch of 8 already is all of it otherwise)
        outs, _ = call(x)
    return {"logits": plan.decode_outputs(ring.decrypt(outs), len(x)), "server_s_1_image": single,
            "server_s_per_image_batch8": batch_s / min(8, len(x)), "keygen_s": keygen,
            "eval_key_bytes": keys.size_bytes, "galois_keys": len(plan.galois_steps), "rotation_keys": rotation_keys,
            "request_bytes": len(ring.encrypt_to_bytes(plan.encode_inputs(x[:1]))),
            "response_bytes": len(seal_to_bytes(outs[0])), "poly_modulus_degree": params.poly_modulus_degree,
            "coeff_mod_bit_sizes": list(params.coeff_mod_bit_sizes), "levels": plan.levels,
            "precision_bits": precision_bits, "batch_capacity": plan.spec["batch_capacity"],
            **plan.spec["rotations"], "images": len(x)}


def run_throughput(graph, x: np.ndarray, precision_bits: int) -> dict:
    """veil throughput mode: the whole of ``x`` in one call (one ciphertext per feature, no rotations)."""
    plan = he_compile(graph, mode="throughput", precision_bits=precision_bits)
    params = plan.parameters()
    ring = SecretKeyring.generate(params, plan.galois_steps)
    keys = ring.evaluation_keys()
    evaluator = PlanEvaluator(plan, params)
    cts = ring.encrypt(plan.encode_inputs(x))
    start = time.perf_counter()
    outs = evaluator.run(cts, keys)
    call = time.perf_counter() - start
    return {"logits": plan.decode_outputs(ring.decrypt(outs), len(x)), "call_s": call,
            "images_per_s_throughput": params.slots / call, "slots_per_call": params.slots,
            "eval_key_bytes": keys.size_bytes, "poly_modulus_degree": params.poly_modulus_degree,
            "coeff_mod_bit_sizes": list(params.coeff_mod_bit_sizes), "levels": plan.levels, "images": len(x)}


def score(run: dict, reference: np.ndarray, labels: np.ndarray) -> dict:
    """Replace the run's logits by plaintext / encrypted accuracy, argmax agreement and max abs logit error."""
    logits = run.pop("logits")
    ref, y = reference[: len(logits)], labels[: len(logits)]
    return {**run, "plain_accuracy": float((ref.argmax(1) == y).mean()),
            "encrypted_accuracy": float((logits.argmax(1) == y).mean()),
            "argmax_agreement": float((logits.argmax(1) == ref.argmax(1)).mean()),
            "max_abs_logit_error": float(np.abs(logits - ref).max())}


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="smoke run: short training, few images")
    parser.add_argument("--baseline-images", type=int, default=100, help="test images through (a)")
    parser.add_argument("--latency-images", type=int, default=100, help="test images through veil latency mode")
    parser.add_argument("--singles", type=int, default=3, help="1-image calls timed per setting (median)")
    parser.add_argument("--seed", type=int, default=0, help="training seed of the digits-he PolyCNN")
    parser.add_argument("--no-polycnn-throughput", action="store_true",
                        help="skip (c) in throughput mode (one call takes minutes and several GB on 2 cores)")
    args = parser.parse_args(argv)
    data = load_digits_preset()
    x, y = data.x_test.astype(np.float64), data.y_test
    quick = args.quick
    n_base, n_lat, singles = (2, 4, 1) if quick else (args.baseline_images, args.latency_images, args.singles)

    tutorial = train_tutorial(data, epochs=3 if quick else 100)
    tut_graph, tut_ort = onnx_of(tutorial)
    tut_ref = tut_ort.run(None, {"x": data.x_test})[0]
    preset = DIGITS_HE_PRESETS["cnn"]
    recipe = {**preset["train"], **({"epochs": 2, "warmup_epochs": 1} if quick else {})}
    trained = train_uldnet(ModelConfig(input_shape=data.input_shape, **preset["model"]),
                           TrainConfig(**recipe, seed=args.seed, threads=1), data, progress=False)
    cnn_graph, cnn_ort = onnx_of(trained.model)
    cnn_ref = cnn_ort.run(None, {"x": data.x_test})[0]
    torch.set_num_threads(1)

    runs = {"a_tenseal_tutorial": score(run_tenseal(tutorial, x[:n_base]), tut_ref, y)}
    bits = fitting_precision(tut_graph, TUTORIAL_N)
    exact = he_compile(tut_graph, mode="latency", precision_bits=bits)
    budgets = [] if quick else sorted({len(exact.galois_steps) // 2, len(exact.galois_steps) // 4} - {0}, reverse=True)
    for setting in ["exact", *(f"budget:{k}" for k in budgets), "pow2"]:
        runs[f"b_veil_same_cnn_{setting}"] = score(run_latency(tut_graph, x[:n_lat], setting, bits, singles), tut_ref, y)
    runs["b_veil_same_cnn_throughput"] = score(run_throughput(tut_graph, x, bits), tut_ref, y)
    runs["c_veil_polycnn_exact"] = score(run_latency(cnn_graph, x[:n_lat], "exact", 20, singles), cnn_ref, y)
    if not (quick or args.no_polycnn_throughput):
        runs["c_veil_polycnn_throughput"] = score(run_throughput(cnn_graph, x, 20), cnn_ref, y)

    report = {"command": command_line(__file__, sys.argv[1:] if argv is None else argv), "environment": environment("1 thread", tenseal=ts.__version__,
                                                                                   torch=torch.__version__),
              "tutorial_model": {"kernel": KERNEL, "stride": STRIDE, "channels": CHANNELS, "hidden": HIDDEN,
                                 "plain_test_accuracy": float((tut_ref.argmax(1) == y).mean())},
              "polycnn": {"preset": preset, "seed": args.seed, "plain_test_accuracy": trained.metrics["test_accuracy"]},
              "runs": runs}
    report["targets"] = targets(runs)
    figure(runs, args.out / "img" / "he_cnn_keys.png")
    save_results(args.out, "he_cnn", report, markdown(report))
    print(json.dumps(report["targets"], indent=1))
    return 0


def targets(runs: dict) -> dict:
    """The issue's targets as ratios against (a), each with its measured value and met / missed."""
    a = runs["a_tenseal_tutorial"]
    b = {k: v for k, v in runs.items() if k.startswith("b_veil_same_cnn_") and "throughput" not in k}
    fastest = min(b.values(), key=lambda r: r["server_s_1_image"])
    fewest = min(b.values(), key=lambda r: r["eval_key_bytes"])
    c = runs["c_veil_polycnn_exact"]
    speed = lambda r: a["server_s_1_image"] / r["server_s_1_image"]  # noqa: E731
    rows = {
        "b_agreement>=99.5%": min(r["argmax_agreement"] for r in b.values()) >= 0.995,
        "b_fastest_speedup>=5x": speed(fastest) >= 5, "b_fastest_keys<=a": fastest["eval_key_bytes"] <= a["eval_key_bytes"],
        "b_fewest_keys_3x_smaller": a["eval_key_bytes"] / fewest["eval_key_bytes"] >= 3,
        "b_fewest_keys_speedup>=2.5x": speed(fewest) >= 2.5,
        "c_encrypted_accuracy>=98.5%": c["encrypted_accuracy"] >= 0.985, "c_agreement>=99.5%": c["argmax_agreement"] >= 0.995,
        "c_1_image<=a": c["server_s_1_image"] <= a["server_s_1_image"],
        "c_batch8_per_image<=a/3": c["server_s_per_image_batch8"] <= a["server_s_1_image"] / 3,
    }
    values = {"b_fastest": fastest["rotation_keys"], "b_fastest_speedup": speed(fastest),
              "b_fewest_keys": fewest["rotation_keys"], "b_fewest_keys_speedup": speed(fewest),
              "b_fewest_keys_ratio": a["eval_key_bytes"] / fewest["eval_key_bytes"],
              "b_fastest_keys_ratio": a["eval_key_bytes"] / fastest["eval_key_bytes"],
              "c_1_image_speedup": speed(c), "c_batch8_speedup": a["server_s_1_image"] / c["server_s_per_image_batch8"]}
    if "c_veil_polycnn_throughput" in runs:
        values["c_throughput_ratio"] = runs["c_veil_polycnn_throughput"]["images_per_s_throughput"] / a["images_per_s_throughput"]
        rows["c_throughput>=30x"] = values["c_throughput_ratio"] >= 30
    return {"met": rows, "values": values}


def figure(runs: dict, path: Path) -> None:
    """Evaluation-key bytes against 1-image server time: (a), (b) at every key setting, (c)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    b = [(k.removeprefix("b_veil_same_cnn_"), r) for k, r in runs.items() if k.startswith("b_") and "throughput" not in k]
    ax.plot([r["eval_key_bytes"] / 2**20 for _, r in b], [r["server_s_1_image"] for _, r in b], "o-", label="(b) veil, same CNN")
    for name, r in b:
        ax.annotate(name, (r["eval_key_bytes"] / 2**20, r["server_s_1_image"]), fontsize=8)
    for key, label, marker in (("a_tenseal_tutorial", "(a) TenSEAL tutorial", "s"), ("c_veil_polycnn_exact", "(c) veil digits-he PolyCNN", "^")):
        r = runs[key]
        ax.plot([r["eval_key_bytes"] / 2**20], [r["server_s_1_image"]], marker, label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("evaluation keys (MiB)")
    ax.set_ylabel("server s / image (1 image)")
    ax.legend(fontsize=8)
    save_figure(fig, path)


def markdown(report: dict) -> str:
    rows = ["| run | N | chain | levels | images | plain acc | enc acc | agreement | max logit err | s/image (1) | "
            "s/image (batch 8) | images/s (throughput) | eval keys | request / response | rotations (key switches) |",
            "|" + "---|" * 15]
    for name, r in report["runs"].items():
        fmt = lambda k, f, r=r: f.format(r[k]) if k in r else "–"  # noqa: E731
        rows.append(f"| {name} | {r['poly_modulus_degree']} | {r['coeff_mod_bit_sizes']} | {r['levels']} | {r['images']} | "
                    f"{r['plain_accuracy']:.2%} | {r['encrypted_accuracy']:.2%} | {r['argmax_agreement']:.2%} | "
                    f"{r['max_abs_logit_error']:.1e} | {fmt('server_s_1_image', '{:.3f}')} | "
                    f"{fmt('server_s_per_image_batch8', '{:.3f}')} | {fmt('images_per_s_throughput', '{:.1f}')} | "
                    f"{r['eval_key_bytes'] / 2**20:.1f} MiB | "
                    + (f"{r['request_bytes'] / 2**10:.0f} / {r['response_bytes'] / 2**10:.0f} KiB | "
                       if "request_bytes" in r else "– | ")
                    + (f"{r['rotations']} ({r['key_switches']}) |" if "rotations" in r else "0 |"))
    t, m = report["targets"], report["tutorial_model"]
    met = [f"- {k}: **{'met' if v else 'missed'}**" for k, v in t["met"].items()]
    values = ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in t["values"].items())
    env = report["environment"]
    return "\n".join([
        "## Encrypted CNNs: veil.he vs TenSEAL's tutorial CNN (issue 17)", "",
        f"Command: `{report['command']}` — {env['date']}, {env['machine']}, tenseal {env['tenseal']}. "
        f"(a) TenSEAL Tutorial 4's recipe on 8x8 digits: conv 1 -> {m['channels']} channels, kernel {m['kernel']} "
        f"stride {m['stride']} (im2col), square, fc -> {m['hidden']}, square, fc -> 10 (plaintext test accuracy "
        f"{m['plain_test_accuracy']:.2%}); (b) the same torch model exported once and compiled by veil.he at the "
        "tutorial's N = 8192, for every rotation-key setting; (c) the `digits-he` PolyCNN "
        f"(plaintext test accuracy {report['polycnn']['plain_test_accuracy']:.2%}). Server time only, one thread; "
        "latency rows on the first test images, throughput rows on the whole test split in one call (images/s with "
        "every slot filled). (a)'s rotations are counted from TenSEAL's algorithms (SEAL's power-of-two "
        "decomposition), veil's from the plan.", "", *rows, "",
        "Targets (ratios in this run, against (a)):", *met, "", f"Values: {values}.", "",
        "![evaluation keys vs latency](img/he_cnn_keys.png)",
    ])


if __name__ == "__main__":
    raise SystemExit(main())
