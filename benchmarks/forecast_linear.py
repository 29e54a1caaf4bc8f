"""Linear forecasters with characteristic-root control: the spec's calibrated synthetic checks, OLS vs RRR vs
DWRR vs Root Purge vs seasonal naive vs statsmodels' Holt-Winters ETS on bundled real series, and the
collapsed forecaster encrypted (CKKS, 128-bit) against plaintext in latency and throughput mode.

Metrics are on the train-standardised scale (as the paper reports them); ranks and λ are chosen on the
validation split only (never on test). Writes docs/results/forecast_linear.json, the `forecast_linear`
section of docs/results.md and docs/img/forecast_roots.png.

    nice -n 10 python benchmarks/forecast_linear.py
    nice -n 10 python benchmarks/forecast_linear.py --quick --out /tmp/docs
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # the shared 2-core machine: BLAS threads only contend

import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from common import argument_parser, command_line, environment, save_results
from veil.training.forecast import (
    BUNDLED,
    ForecastDataConfig,
    ForecastFitConfig,
    ForecastModelConfig,
    characteristic_roots,
    fit,
    load_bundled,
    make_splits,
    plot_roots,
    predictor_polynomial,
    root_counts,
    save_forecaster,
    synthetic_series,
    train_forecaster,
)
from veil.training.forecast.diagnostics import one_step_weights
from veil.training.forecast.linear import rrr

# (series, lookback, horizon, seasonal period): periods of a year (weeks, months) and the ~11-year solar cycle
REAL = [("co2", 104, 52, 52), ("elnino", 48, 12, 12), ("sunspots", 33, 11, 11)]
LAMBDAS = [0.125, 0.25, 0.5, 1.0, 2.0]
TRUE_ROOTS = np.exp(1j * np.array([0.02, -0.02, 0.05, -0.05]))  # and a double root at 1 (the trend)


def mse(pred: np.ndarray, y: np.ndarray) -> float:
    return float(((pred - y) ** 2).mean())


def synthetic(quick: bool) -> dict[str, Any]:
    """§7.1 identity, §7.3 noise-free roots and the noisy calibration (L = H = 336, σ = 0.5, 50/25/25)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 24))
    y = x @ rng.normal(size=(24, 4)) @ rng.normal(size=(4, 16)) + 0.3 * rng.normal(size=(400, 16))
    fitted = x @ np.linalg.lstsq(x, y, rcond=None)[0]
    sigma = np.linalg.svd(fitted, compute_uv=False)
    worst = 0.0
    for rank in range(1, 17):
        w, _ = rrr(x, y, x, y, ForecastFitConfig(fit="rrr", rank=rank), 16, False)
        sse = ((y - x @ w) ** 2).sum()
        worst = max(worst, abs(sse - ((y - fitted) ** 2).sum() - (sigma[rank:] ** 2).sum()) / sse)
    noise_free = {}
    for lookback in (8, 12, 24):
        splits = make_splits(synthetic_series(800, sigma=0.0), lookback, 1, ForecastDataConfig(standardize=False))
        forecaster = fit(splits, ForecastModelConfig(lookback=lookback, horizon=1, instance_norm="none"),
                         ForecastFitConfig(fit="ols"))
        p = predictor_polynomial(one_step_weights(forecaster)[0])
        noise_free[lookback] = {"max_abs_p_at_roots": float(max(abs(np.polyval(p, r)) for r in TRUE_ROOTS)),
                                "abs_p_at_1": float(abs(np.polyval(p, 1.0))),
                                "abs_dp_at_1": float(abs(np.polyval(np.polyder(p), 1.0)))}
    splits = make_splits(synthetic_series(6000, sigma=0.5, seed=0), 336, 336,
                         ForecastDataConfig(split=[0.5, 0.25, 0.25], standardize=False, context=False))
    model = ForecastModelConfig(lookback=336, horizon=336, instance_norm="mean")
    fits = {"OLS": ForecastFitConfig(fit="ols"), "RRR": ForecastFitConfig(fit="rrr"),
            "DWRR": ForecastFitConfig(fit="dwrr")}
    fits |= {f"RootPurge fixed point λ={lam:g}": ForecastFitConfig(fit="rootpurge", rp_solver="fixed_point",
                                                                   rp_lambda=lam) for lam in (0.5, 1.0, 2.0)}
    if not quick:
        fits["RootPurge torch λ=1 (2000 steps)"] = ForecastFitConfig(fit="rootpurge", rp_lambda=1.0, steps=2000,
                                                                     lr=1e-3, rp_init="ols")
    rows, roots = [], {}
    for name, config in fits.items():
        start = time.perf_counter()
        forecaster = fit(splits, model, config)
        seconds = time.perf_counter() - start
        singular = forecaster.singular_values()[0]
        found = characteristic_roots(forecaster)[0]
        rows.append({"fit": name, "test_mse": mse(forecaster.predict(splits.test.x), splits.test.y),
                     "rank": forecaster.info.get("rank", [None])[0], "sv_above_1pct": int((singular > 0.01 * singular[0]).sum()),
                     "top3_sv": singular[:3].tolist(), "roots": root_counts(found),
                     "fit_s": seconds})
        if name in ("OLS", "RRR", "RootPurge fixed point λ=2"):
            roots[name] = found
    return {"identity_rel_err": worst, "noise_free": noise_free, "noisy": rows, "roots": roots}


def seasonal_naive(x_raw: np.ndarray, horizon: int, period: int) -> np.ndarray:
    """ŷ_{t+h} = y_{t+h-p·ceil(h/p)}: the last observed season repeated (x_raw (N, L, C), L >= period)."""
    h = np.arange(1, horizon + 1)
    back = period * np.ceil(h / period).astype(int) - h  # steps before the last observed one
    return x_raw[:, x_raw.shape[1] - 1 - back]


def holt_winters(values: np.ndarray, train_end: int, origins: np.ndarray, horizon: int, period: int) -> np.ndarray:
    """statsmodels' additive Holt-Winters fitted on the train split, then run with those fixed parameters over the
    whole series; forecasts from each origin t (last observed step) read off its states (N, H)."""
    from statsmodels.tsa.holtwinters import ExponentialSmoothing

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trained = ExponentialSmoothing(values[:train_end], trend="add", seasonal="add", seasonal_periods=period,
                                       initialization_method="estimated").fit()
        p = trained.params
        full = ExponentialSmoothing(values, trend="add", seasonal="add", seasonal_periods=period,
                                    initialization_method="known", initial_level=p["initial_level"],
                                    initial_trend=p["initial_trend"], initial_seasonal=p["initial_seasons"]).fit(
            smoothing_level=p["smoothing_level"], smoothing_trend=p["smoothing_trend"],
            smoothing_seasonal=p["smoothing_seasonal"], optimized=False)
    h = np.arange(1, horizon + 1)
    t = origins[:, None]
    return full.level[t] + h * full.trend[t] + full.season[t + h - period * ((h - 1) // period + 1)]


def real_series(quick: bool) -> list[dict[str, Any]]:
    out = []
    for name, lookback, horizon, period in REAL:
        series = load_bundled(name)
        data = ForecastDataConfig()  # 70/10/20, train-only standardisation
        splits = make_splits(series, lookback, horizon, data)
        model = ForecastModelConfig(lookback=lookback, horizon=horizon, instance_norm="mean")
        test = splits.test
        scale = splits.scaler
        preds: dict[str, np.ndarray] = {}
        info: dict[str, Any] = {}
        for label, config in (("OLS", ForecastFitConfig(fit="ols")), ("RRR", ForecastFitConfig(fit="rrr")),
                              ("DWRR", ForecastFitConfig(fit="dwrr"))):
            forecaster = fit(splits, model, config)
            preds[label] = forecaster.predict(test.x)
            info[label] = forecaster.info.get("rank", [None])[0]
        val = {}
        for lam in LAMBDAS:  # λ on validation
            forecaster = fit(splits, model, ForecastFitConfig(fit="rootpurge", rp_solver="fixed_point", rp_lambda=lam))
            val[lam] = (mse(forecaster.predict(splits.val.x), splits.val.y), forecaster)
        best = min(val, key=lambda k: val[k][0])
        preds["Root Purge (fixed point)"] = val[best][1].predict(test.x)
        info["Root Purge (fixed point)"] = f"λ={best:g}"
        if not quick:
            torch_fit = fit(splits, model, ForecastFitConfig(fit="rootpurge", rp_lambda=best, steps=3000, lr=1e-3,
                                                             batch_size=128))
            preds["Root Purge (torch, code init)"] = torch_fit.predict(test.x)
            info["Root Purge (torch, code init)"] = f"λ={best:g}, 3000 steps"
        raw_x = scale.inverse(test.x)
        preds["seasonal naive"] = scale.transform(seasonal_naive(raw_x, horizon, period))
        start, _ = splits.ranges["test"]
        origins = start + lookback - 1 + np.arange(len(test.x))  # the last observed step of each test window
        hw = holt_winters(series.values[:, 0], splits.ranges["train"][1], origins, horizon, period)
        preds["statsmodels Holt-Winters ETS"] = scale.transform(hw[:, :, None])
        rows = []
        for label, pred in preds.items():
            per_h = ((pred - test.y) ** 2).mean(axis=(0, 2))
            rows.append({"method": label, "mse": mse(pred, test.y), "mae": float(np.abs(pred - test.y).mean()),
                         "mse_h1": float(per_h[0]), "mse_hmid": float(per_h[horizon // 2]), "mse_hH": float(per_h[-1]),
                         "setting": info.get(label)})
        out.append({"series": name, "about": BUNDLED[name][1], "lookback": lookback, "horizon": horizon,
                    "period": period, "test_windows": len(test.x), "rows": rows})
    return out


def encrypted(quick: bool) -> dict[str, Any]:
    """co2 RRR forecaster (L=104, H=52) collapsed, exported and compiled; encrypted vs plaintext."""
    from veil.export.forecast import export_forecast, export_forecast_he
    from veil.he.evaluate import PlanEvaluator
    from veil.he.keys import SecretKeyring
    from veil.he.plan import Plan
    from veil.training.forecast import load_forecaster

    series = load_bundled("co2")
    model = ForecastModelConfig(lookback=104, horizon=52, instance_norm="mean")
    result = train_forecaster(series, model, ForecastFitConfig(fit="rrr"))
    splits = make_splits(series, 104, 52)
    x_raw = splits.scaler.inverse(splits.test.x)
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = save_forecaster(result, Path(tmp) / "co2-rrr")
        forecaster, _ = load_forecaster(ckpt)
        onnx_manifest = export_forecast(ckpt, Path(tmp) / "models", "co2")
        out["onnx_validation_max_abs"] = max(c["max_abs_diff"] for c in onnx_manifest["validation"]["cases"])
        out["collapse_max_abs"] = onnx_manifest["collapse"]["max_abs_diff"]
        for mode, count in (("latency", 4), ("throughput", 0)):
            manifest = export_forecast_he(ckpt, Path(tmp) / "models", f"co2-he-{mode}", mode)
            plan = Plan.load(Path(tmp) / "models" / f"co2-he-{mode}" / "1")
            params = plan.parameters()
            start = time.perf_counter()
            ring = SecretKeyring.generate(params, plan.galois_steps)
            keys = ring.evaluation_keys()
            keygen = time.perf_counter() - start
            evaluator = PlanEvaluator(plan, params)
            if mode == "latency":  # one series per request, as a client forecasting its own series would
                times, errs = [], []
                for i in range(count):
                    x = x_raw[i:i + 1]
                    t0 = time.perf_counter()
                    cts = ring.encrypt(plan.encode_inputs(x))
                    t1 = time.perf_counter()
                    res = evaluator.run(cts, keys)
                    t2 = time.perf_counter()
                    y = plan.decode_outputs(ring.decrypt(res), 1)
                    t3 = time.perf_counter()
                    times.append((t1 - t0, t2 - t1, t3 - t2))
                    errs.append(float(np.abs(y - forecaster.predict_raw(x)).max()))
                med = np.median(np.array(times), axis=0)
                out[mode] = {"series": count, "encrypt_s": float(med[0]), "server_s": float(med[1]),
                             "decrypt_s": float(med[2]), "max_abs_err": max(errs)}
            else:  # every slot holds one series: N/2 series per call
                capacity = plan.spec["batch_capacity"]
                reps = int(np.ceil(capacity / len(x_raw)))
                x = np.concatenate([x_raw] * reps)[:capacity] if not quick else x_raw
                t0 = time.perf_counter()
                cts = ring.encrypt(plan.encode_inputs(x))
                t1 = time.perf_counter()
                res = evaluator.run(cts, keys)
                t2 = time.perf_counter()
                y = plan.decode_outputs(ring.decrypt(res), len(x))
                t3 = time.perf_counter()
                out[mode] = {"series": len(x), "encrypt_s": t1 - t0, "server_s": t2 - t1, "decrypt_s": t3 - t2,
                             "series_per_s_server": len(x) / (t2 - t1),
                             "max_abs_err": float(np.abs(y - forecaster.predict_raw(x)).max())}
            t0 = time.perf_counter()
            forecaster.predict_raw(x_raw)
            out["plaintext_numpy_s_per_series"] = (time.perf_counter() - t0) / len(x_raw)
            out[mode] |= {"N": params.poly_modulus_degree, "chain": list(params.coeff_mod_bit_sizes),
                          "levels": manifest["levels"], "keygen_s": keygen, "galois_keys": len(plan.galois_steps)}
        out["output_range"] = [float(x_raw.min()), float(x_raw.max())]
    return out


def render(results: dict[str, Any], argv: list[str] | None) -> str:
    syn, env = results["synthetic"], results["environment"]
    lines = ["## Linear forecasters with characteristic-root control (`forecast_linear`, issue 21)", "",
             f"Command: `nice -n 10 {command_line(__file__, argv)}` — {env['date']}, {env['machine']}. Spec: "
             "shared/specs/other_seeds.md §3, §7. MSE/MAE on the train-standardised scale; ranks and λ chosen on "
             "validation only.", "",
             "### Calibrated synthetic checks", "",
             f"- RRR Pythagoras / Eckart–Young identity, worst relative error over ρ = 1..16: "
             f"{syn['identity_rel_err']:.1e} (target < 1e-10).",
             "- Noise-free, H = 1, no instance norm: max |p(r)| at e^{±0.02i}, e^{±0.05i}; |p(1)|, |p'(1)| (target < 1e-9): "
             + "; ".join(f"L={k}: {v['max_abs_p_at_roots']:.1e}, {v['abs_p_at_1']:.1e}, {v['abs_dp_at_1']:.1e}"
                         for k, v in syn["noise_free"].items()) + ".", "",
             "Noisy series y = sin(2x) + cos(5x) + 0.5x + 0.5·N(0,1), 6000 points, 50/25/25, L = H = 336, instance "
             "norm (noise floor 0.25):", "",
             "| fit | test MSE | vs OLS | rank | singular values > 1 % of max | top-3 σ | roots inside / on / outside | fit s |",
             "|---|---|---|---|---|---|---|---|"]
    ols = syn["noisy"][0]["test_mse"]
    for row in syn["noisy"]:
        lines.append(f"| {row['fit']} | {row['test_mse']:.4f} | {100 * (row['test_mse'] / ols - 1):+.1f} % | "
                     f"{row['rank'] or '–'} | {row['sv_above_1pct']} | {', '.join(f'{s:.3f}' for s in row['top3_sv'])} | "
                     f"{row['roots']['inside']} / {row['roots']['on']} / {row['roots']['outside']} | {row['fit_s']:.1f} |")
    lines += ["", "![roots](img/forecast_roots.png)", "", "### Bundled real series (statsmodels.datasets), 70/10/20", ""]
    for block in results["real"]:
        lines += [f"**{block['series']}** — {block['about']}; L = {block['lookback']}, H = {block['horizon']}, "
                  f"seasonal period {block['period']}, {block['test_windows']} test windows.", "",
                  "| method | setting | test MSE | test MAE | MSE h=1 | MSE h=H/2 | MSE h=H |", "|---|---|---|---|---|---|---|"]
        best = min(r["mse"] for r in block["rows"])
        for r in block["rows"]:
            mark = "**" if r["mse"] == best else ""
            lines.append(f"| {r['method']} | {r['setting'] if r['setting'] is not None else ''} | {mark}{r['mse']:.4f}{mark} | "
                         f"{r['mae']:.4f} | {r['mse_h1']:.4f} | {r['mse_hmid']:.4f} | {r['mse_hH']:.4f} |")
        lines.append("")
    lines += ["Where root control helps (test MSE of the best rank-reduced or purged fit against OLS):", ""]
    for block in results["real"]:
        rows = {r["method"]: r["mse"] for r in block["rows"]}
        control = min((k for k in rows if k.startswith(("RRR", "DWRR", "Root Purge"))), key=rows.get)
        change = 100 * (rows[control] / rows["OLS"] - 1)
        lines.append(f"- {block['series']}: {control} {change:+.1f} % vs OLS; best overall: {min(rows, key=rows.get)}.")
    lines += ["", "Root control pays where the series has few true roots under noise (the synthetic series; El Niño "
              "slightly); on smooth, high-SNR co2 every linear fit ties, and on the short, irregular sunspots record "
              "(~170 train windows) rank reduction removes real dynamics and OLS stays best. In overall test MSE the "
              "linear fits beat seasonal naive and Holt-Winters on all three series (Holt-Winters is better one step "
              "ahead on El Niño).", ""]
    he = results["encrypted"]
    lines += ["### Encrypted forecasts (co2 RRR, L = 104, H = 52, raw ppm scale)", "",
              f"Collapse to one affine map: max |Δ| {he['collapse_max_abs']:.1e}; ONNX (float32) vs numpy: "
              f"{he['onnx_validation_max_abs']:.1e}. Input windows span {he['output_range'][0]:.0f}–"
              f"{he['output_range'][1]:.0f} ppm. Plaintext numpy: {1e6 * he['plaintext_numpy_s_per_series']:.1f} µs/series.", "",
              "| mode | N | chain | levels | Galois keys | series | encrypt s | server s | decrypt s | series/s (server) | max abs err |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for mode in ("latency", "throughput"):
        r = he[mode]
        rate = r.get("series_per_s_server", 1 / r["server_s"])
        lines.append(f"| {mode} | {r['N']} | {r['chain']} | {r['levels']} | {r['galois_keys']} | {r['series']} | "
                     f"{r['encrypt_s']:.3f} | {r['server_s']:.3f} | {r['decrypt_s']:.3f} | {rate:.1f} | {r['max_abs_err']:.1e} |")
    lines += ["", "Latency rows are medians per series (one series per request); throughput is one call with every slot "
              "holding a series.", "", "### Targets", ""] + [f"- {t}" for t in results["targets"]]
    return "\n".join(lines) + "\n"


def targets(results: dict[str, Any]) -> list[str]:
    syn = results["synthetic"]
    rows = {r["fit"]: r for r in syn["noisy"]}
    ols, rr = rows["OLS"]["test_mse"], rows["RRR"]["test_mse"]
    rp = min(v["test_mse"] for k, v in rows.items() if k.startswith("RootPurge fixed point"))
    sv = [rows[f"RootPurge fixed point λ={lam:g}"]["sv_above_1pct"] for lam in (0.5, 1.0, 2.0)]
    nf = max(max(v.values()) for v in syn["noise_free"].values())
    he = results["encrypted"]
    err = max(he["latency"]["max_abs_err"], he["throughput"]["max_abs_err"])
    ok = lambda c: "**met**" if c else "**missed**"  # noqa: E731
    return [f"identity < 1e-10: {ok(syn['identity_rel_err'] < 1e-10)} ({syn['identity_rel_err']:.1e})",
            f"noise-free p(r) < 1e-9: {ok(nf < 1e-9)} ({nf:.1e})",
            f"RRR beats OLS by >= 5 %: {ok(rr <= 0.95 * ols)} ({100 * (1 - rr / ols):.1f} %)",
            f"Root Purge beats OLS by >= 3 %: {ok(rp <= 0.97 * ols)} ({100 * (1 - rp / ols):.1f} %, best fixed-point λ)",
            f"chosen ρ in [4, 8]: {ok(4 <= rows['RRR']['rank'] <= 8)} (ρ = {rows['RRR']['rank']})",
            f"singular values > 1 % decrease in λ: {ok(sv[0] > sv[1] > sv[2])} ({' → '.join(map(str, sv))}; OLS "
            f"{rows['OLS']['sv_above_1pct']})",
            f"encrypted vs plaintext <= 1e-3 abs at 128-bit: {ok(err <= 1e-3)} ({err:.1e} on the raw ppm scale)"]


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="skip the torch trainer runs and fill fewer HE slots")
    args = parser.parse_args(argv)
    import statsmodels
    import tenseal
    import torch

    torch.set_num_threads(1)
    results: dict[str, Any] = {"environment": environment("1 thread", statsmodels=statsmodels.__version__,
                                                          tenseal=tenseal.__version__, torch=torch.__version__)}
    results["synthetic"] = synthetic(args.quick)
    plot_roots(list(results["synthetic"].pop("roots").values()), args.out / "img" / "forecast_roots.png",
               title="synthetic series: roots of the one-step predictor",
               labels=["OLS", "RRR", "Root Purge λ=2"])
    results["real"] = real_series(args.quick)
    results["encrypted"] = encrypted(args.quick)
    results["targets"] = targets(results)
    save_results(args.out, "forecast_linear", results, render(results, argv))
    print("\n".join(results["targets"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
