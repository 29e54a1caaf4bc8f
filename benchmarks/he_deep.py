"""Deep ULD-Net models run encrypted with client refresh: the 28-level digits PolyCNN (issue 18 §2 targets).

The digits PolyCNN (``veil train uldnet --preset digits --arch cnn``; ``--width`` overrides the preset's 32)
needs 28 levels, more than any 128-bit leveled set offers, so it is exported with ``--refresh``: the
compiler cuts it into segments (each with its own parameter set) and ``veil serve`` runs one per round
while the client decrypts, re-encodes and encrypts fresh between them. The run goes through the real
HTTP server and ``HeSession`` (keys registered once, every round bound to one request) and reports argmax
agreement with ONNX Runtime, accuracy, rounds, seconds per image split into server / client refresh /
network (HTTP minus server time) / client encrypt+decrypt, and bytes per round. The PolyViT row says
whether the compiler lowers it yet. ``--ring-65536`` adds the measurement behind docs/he.md's finding on
N = 65536 (minutes, ~6 GB).

    .venv/bin/python benchmarks/he_deep.py                       # writes docs/results/he_deep.json + results.md
    .venv/bin/python benchmarks/he_deep.py --width 4 --images 100 --cache runs/he-deep
    .venv/bin/python benchmarks/he_deep.py --quick               # smoke run (tiny model, 2 images)
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import torch
from veil.engine.server import ServerConfig, build_server
from veil.export import export_graph, export_uldnet
from veil.export.he import export_he
from veil.he.client import HeSession
from veil.training.uldnet import (
    ModelConfig,
    TrainConfig,
    build_model,
    load_digits_preset,
    save_uldnet,
    train_uldnet,
)
from veil.training.uldnet.config import DIGITS_PRESETS

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import argument_parser, command_line, environment, save_results


def checkpoint(folder: Path, arch: str, width: int, epochs: int) -> Path:
    """The digits preset of ``arch`` (width overridden), trained once into ``folder`` and reused after."""
    path = folder / f"{arch}-w{width}-e{epochs}"
    if (path / "config.json").is_file():
        return path
    preset = DIGITS_PRESETS[arch]
    model = {**preset["model"], "width": width}
    data = load_digits_preset()
    result = train_uldnet(ModelConfig(arch=arch, input_shape=[1, 8, 8], **model),
                          TrainConfig(**{**preset["train"], "epochs": epochs, "warmup_epochs": min(5, epochs - 1),
                                         "seed": 0}), data, progress=False)
    save_uldnet(result, path, data)
    return path


class Server:
    """``veil serve`` on 127.0.0.1 in a thread (as the engine tests run it)."""

    def __init__(self, repo: Path) -> None:
        self.server = build_server(ServerConfig(repo=str(repo), host="127.0.0.1", port=0, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 600
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("veil serve did not start")
            time.sleep(0.05)
        return f"http://127.0.0.1:{self.server.servers[0].sockets[0].getsockname()[1]}"

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=60)


def run_cnn(ck: Path, workdir: Path, images: int, precision_bits: int, max_n: int | None) -> dict[str, Any]:
    data = load_digits_preset()
    repo = workdir / "repo"
    start = time.perf_counter()
    manifest = export_he(ck, repo, "cnn-he", precision_bits=precision_bits, refresh=True,
                         max_poly_modulus_degree=max_n)
    export_s = time.perf_counter() - start
    export_uldnet(ck, repo, name="cnn-plain")
    x, y = data.x_test[:images], data.y_test[:images]
    plain = ort.InferenceSession(str(repo / "cnn-plain" / "1" / "model.onnx")).run(None, {"x": x})[0]
    rows = []
    with Server(repo) as url:
        start = time.perf_counter()
        session = HeSession.create(url, "cnn-he", workdir / "keys" / "cnn.keyring")
        keygen_s = time.perf_counter() - start
        logits = []
        for i in range(images):
            t0 = time.perf_counter()
            request = session.encrypt(x[i:i + 1])
            t1 = time.perf_counter()
            result = session.infer(request)
            t2 = time.perf_counter()
            logits.append(session.decrypt(result)[0])
            t3 = time.perf_counter()
            rounds = session.last_rounds
            server = sum(r["server_seconds"] for r in rounds)
            rows.append({"encrypt_decrypt_s": (t1 - t0) + (t3 - t2), "server_s": server,
                         "refresh_s": sum(r.get("refresh_seconds", 0.0) for r in rounds),
                         "network_s": sum(r["http_seconds"] for r in rounds) - server, "total_s": t3 - t0,
                         "bytes": [(r["request_bytes"], r["result_bytes"]) for r in rounds]})
    logits = np.stack(logits)
    seg = manifest["segmentation"]
    per_round = [{"round": k, "request_bytes": int(statistics.median(r["bytes"][k][0] for r in rows)),
                  "result_bytes": int(statistics.median(r["bytes"][k][1] for r in rows))}
                 for k in range(manifest["rounds"])]
    return {
        "images": images, "rounds": manifest["rounds"], "cuts": manifest["cuts"],
        "segments": [{k: s[k] for k in ("levels", "poly_modulus_degree", "coeff_mod_bit_sizes")}
                     for s in seg.get("segments", [])],
        "unsegmented_levels": seg.get("unsegmented_levels", seg.get("levels")), "why": seg["why"],
        "argmax_agreement": float((logits.argmax(1) == plain.argmax(1)).mean()),
        "accuracy_encrypted": float((logits.argmax(1) == y).mean()),
        "accuracy_plaintext": float((plain.argmax(1) == y).mean()),
        "max_abs_logit_error": float(np.abs(logits - plain).max()),
        "seconds_per_image": {k: statistics.median(r[k] for r in rows)
                              for k in ("total_s", "server_s", "refresh_s", "network_s", "encrypt_decrypt_s")},
        "bytes_per_round": per_round, "keygen_register_s": keygen_s, "export_compile_s": export_s,
        "key_bytes": sum(len(ring.evaluation_keys().to_bytes()) for _, _, ring in session.rings.values()),
    }


def vit_row(width: int | None) -> dict[str, Any]:
    """Whether the compiler lowers the digits PolyViT yet (and its segmentation when it does); compiling
    does not depend on the weights, so the preset architecture is exported untrained."""
    from veil.he.compile import CompileError
    from veil.he.errors import ParameterError
    from veil.he.segments import compile_segmented

    torch.manual_seed(0)
    preset = {**DIGITS_PRESETS["vit"]["model"], **({"width": width} if width else {})}
    model = build_model(ModelConfig(arch="vit", input_shape=[1, 8, 8], **preset)).eval()
    graph = export_graph(model, (torch.randn(4, 1, 8, 8),), ["x"], ["logits"], {"x": {0: "batch"}}).model
    try:
        plan = compile_segmented(graph, refresh=True)
    except (CompileError, ParameterError) as exc:
        return {"status": "not compiled yet", "reason": str(exc)[:300]}
    return {"status": "compiles", "rounds": plan.rounds, "cuts": plan.cuts,
            "levels": [p.levels for p in plan.plans], "note": "not run encrypted in this benchmark"}


def ring_65536() -> dict[str, Any]:
    """What one N = 65536 set (28 levels, the PolyCNN without refresh) costs in tenseal 0.3.18's SEAL."""
    import resource

    import tenseal.sealapi as sa
    from veil.he.serialize import seal_to_bytes

    n, chain = 65536, [55] + [35] * 28 + [55]
    parms = sa.EncryptionParameters(sa.SCHEME_TYPE.CKKS)
    parms.set_poly_modulus_degree(n)
    parms.set_coeff_modulus(sa.CoeffModulus.Create(n, chain))
    out: dict[str, Any] = {"N": n, "log2_q": sum(chain), "he_standard_128_bound": 1772,
                           "seal_tc128_max_bit_count": sa.CoeffModulus.MaxBitCount(n, sa.SEC_LEVEL_TYPE.TC128),
                           "seal_tc128_accepts": sa.SEALContext(parms, True, sa.SEC_LEVEL_TYPE.TC128).parameters_set()}
    ctx = sa.SEALContext(parms, True, sa.SEC_LEVEL_TYPE.NONE)  # only to measure; veil never serves this
    keygen = sa.KeyGenerator(ctx)
    t = time.perf_counter()
    relin = sa.RelinKeys()
    keygen.create_relin_keys(relin)
    out["relin_keygen_s"] = time.perf_counter() - t
    out["relin_seeded_bytes"] = len(seal_to_bytes(keygen.create_relin_keys()))
    encryptor, evaluator, encoder = sa.Encryptor(ctx, keygen.secret_key()), sa.Evaluator(ctx), sa.CKKSEncoder(ctx)
    pt = sa.Plaintext()
    encoder.encode(np.random.default_rng(0).random(n // 2).tolist(), 2.0 ** 35, pt)
    ct = sa.Ciphertext()
    encryptor.encrypt_symmetric(pt, ct)
    out["ciphertext_seeded_bytes"] = len(seal_to_bytes(encryptor.encrypt_symmetric(pt)))
    t = time.perf_counter()
    sq = sa.Ciphertext()
    evaluator.square(ct, sq)
    evaluator.relinearize_inplace(sq, relin)
    evaluator.rescale_to_next_inplace(sq)
    out["square_relin_rescale_s"] = time.perf_counter() - t
    t = time.perf_counter()
    galois = keygen.create_galois_keys([ctx.key_context_data().galois_tool().get_elt_from_step(1)])
    out["galois_key_seeded_bytes"] = len(seal_to_bytes(galois))
    out["galois_keygen_s"] = time.perf_counter() - t
    out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    return out


def markdown(report: dict[str, Any]) -> str:
    cnn, env = report["cnn"], report["environment"]
    s = cnn["seconds_per_image"]
    lines = [
        "## Deep models encrypted with client refresh (`he_deep`)", "",
        f"{env['date']}, {env['machine']}; `{report['command']}`. Digits PolyCNN width {report['width']} "
        f"({report['epochs']} epochs), {cnn['images']} test images one per request through `veil serve` and "
        f"`HeSession` (median per image). {report['precision_bits']} bits of precision"
        + (f", segments limited to N <= {report['max_n']}" if report["max_n"] else "") + ".", "",
        "| model | levels (unsegmented) | rounds | cuts | segments (levels @ N) | argmax agreement vs ORT | "
        "accuracy enc / plain | s/image total | server | client refresh | network | encrypt+decrypt |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
        f"| PolyCNN | {cnn['unsegmented_levels']} | {cnn['rounds']} | {', '.join(cnn['cuts'])} | "
        + ", ".join(f"{g['levels']} @ {g['poly_modulus_degree']}" for g in cnn["segments"])
        + f" | {100 * cnn['argmax_agreement']:.1f} % | {100 * cnn['accuracy_encrypted']:.1f} / "
          f"{100 * cnn['accuracy_plaintext']:.1f} % | {s['total_s']:.2f} | {s['server_s']:.2f} | "
          f"{s['refresh_s']:.3f} | {s['network_s']:.3f} | {s['encrypt_decrypt_s']:.3f} |",
    ]
    vit = report["vit"]
    lines.append(f"| PolyViT | — | — | — | — | {vit['status']}"
                 + (f" (the compiler refuses it: {vit['reason'].split(';')[0]})" if vit["status"] != "compiles" else
                    f": {vit['rounds']} rounds, levels {vit['levels']}") + " | | | | | | |")
    lines += ["", "Bytes per round (median): " + "; ".join(
        f"round {r['round']}: {r['request_bytes'] / 2**20:.2f} MiB in, {r['result_bytes'] / 2**20:.2f} MiB out"
        for r in cnn["bytes_per_round"]) + f". Key sets (all rounds): {cnn['key_bytes'] / 2**20:.1f} MiB on the "
        f"client; keygen + registration {cnn['keygen_register_s']:.1f} s; export + segmented compile "
        f"{cnn['export_compile_s']:.1f} s. Max |logit error| {cnn['max_abs_logit_error']:.2e}.", "",
        f"Why these cuts: {cnn['why'].split(' (', 1)[0]}; " + cnn["why"].rsplit("); ", 1)[-1] + "."]
    if report.get("ring_65536"):
        r = report["ring_65536"]
        lines += ["", f"N = 65536 (28 levels, log2 Q = {r['log2_q']} <= {r['he_standard_128_bound']}): SEAL's "
                  f"128-bit table has no entry (MaxBitCount {r['seal_tc128_max_bit_count']}, TC128 accepts: "
                  f"{r['seal_tc128_accepts']}); relin keys {r['relin_seeded_bytes'] / 2**20:.0f} MiB seeded "
                  f"({r['relin_keygen_s']:.0f} s), one Galois key {r['galois_key_seeded_bytes'] / 2**20:.0f} MiB "
                  f"({r['galois_keygen_s']:.0f} s), a fresh ciphertext {r['ciphertext_seeded_bytes'] / 2**20:.1f} "
                  f"MiB, one square + relin + rescale {r['square_relin_rescale_s']:.1f} s, peak RSS "
                  f"{r['peak_rss_mib']} MiB."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="smoke run: width 4, 3 epochs, 2 images, 12 bits, N <= 16384")
    parser.add_argument("--width", type=int, default=None, help="PolyCNN width (default: the digits preset's 32)")
    parser.add_argument("--epochs", type=int, default=15, help="training epochs (the checkpoint is cached)")
    parser.add_argument("--images", type=int, default=100, help="test images run encrypted")
    parser.add_argument("--precision-bits", type=int, default=20, help="fractional bits per segment")
    parser.add_argument("--max-n", type=int, default=None, choices=[8192, 16384, 32768],
                        help="largest ring a segment may use (more rounds, smaller keys)")
    parser.add_argument("--cache", type=Path, default=None, help="folder for trained checkpoints (reused)")
    parser.add_argument("--ring-65536", action="store_true", help="also measure one N = 65536 set (~6 GB)")
    args = parser.parse_args(argv)
    if args.quick:
        args.width, args.epochs, args.images, args.precision_bits, args.max_n = 4, 3, 2, 12, 16384
    width = args.width or DIGITS_PRESETS["cnn"]["model"]["width"]
    with tempfile.TemporaryDirectory(prefix="veil-he-deep-") as tmp:
        cache = args.cache or Path(tmp) / "runs"
        cnn_ck = checkpoint(cache, "cnn", width, args.epochs)
        report = {"environment": environment(), "command": command_line(__file__, sys.argv[1:] if argv is None else argv),
                  "width": width,
                  "epochs": args.epochs, "precision_bits": args.precision_bits, "max_n": args.max_n,
                  "cnn": run_cnn(cnn_ck, Path(tmp), args.images, args.precision_bits, args.max_n),
                  "vit": vit_row(8 if args.quick else None)}
    if args.ring_65536:
        report["ring_65536"] = ring_65536()
    save_results(args.out, "he_deep", report, markdown(report))
    print(json.dumps({k: report["cnn"][k] for k in ("rounds", "argmax_agreement", "seconds_per_image")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
