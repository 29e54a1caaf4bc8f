"""Fit the four linear forecasters on a bundled real series, look at their roots, export the best one and
forecast with it encrypted (the series never leaves the client in the clear).

    python examples/forecast.py                      # co2, L = 104, H = 52
    python examples/forecast.py --series elnino --lookback 48 --horizon 12 --workdir /tmp/fc
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
from veil.export.forecast import export_forecast, export_forecast_he
from veil.he.evaluate import PlanEvaluator
from veil.he.keys import SecretKeyring
from veil.he.plan import Plan
from veil.training.forecast import (
    ForecastFitConfig,
    ForecastModelConfig,
    characteristic_roots,
    load_bundled,
    make_splits,
    root_counts,
    save_forecaster,
    train_forecaster,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--series", default="co2", help="bundled series: co2, elnino, sunspots, macrodata")
    parser.add_argument("--lookback", type=int, default=104)
    parser.add_argument("--horizon", type=int, default=52)
    parser.add_argument("--workdir", type=Path, default=None, help="where the checkpoint and models go (default: temp)")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp())
    series = load_bundled(args.series)
    model = ForecastModelConfig(lookback=args.lookback, horizon=args.horizon, instance_norm="mean")
    results = {}
    for name, config in {"ols": ForecastFitConfig(fit="ols"), "rrr": ForecastFitConfig(fit="rrr"),
                         "dwrr": ForecastFitConfig(fit="dwrr"),
                         "rootpurge": ForecastFitConfig(fit="rootpurge", rp_solver="fixed_point", rp_lambda=0.5)}.items():
        results[name] = train_forecaster(series, model, config)
        m = results[name].metrics
        counts = root_counts(characteristic_roots(results[name].forecaster)[0])
        print(f"{name:9s} val MSE {m['val_mse']:.4f}  test MSE {m['test_mse']:.4f}  rank {m.get('rank', ['-'])[0]}  "
              f"roots inside/on/outside {counts['inside']}/{counts['on']}/{counts['outside']}")
    best = min(results, key=lambda k: results[k].metrics["val_mse"])  # chosen on validation, never on test
    ckpt = save_forecaster(results[best], workdir / f"{args.series}-{best}")
    manifest = export_forecast(ckpt, workdir / "models", args.series)
    print(f"exported {best}: {manifest['export']['graph']}, ONNX vs numpy max |diff| "
          f"{max(c['max_abs_diff'] for c in manifest['validation']['cases']):.1e}")

    export_forecast_he(ckpt, workdir / "models", f"{args.series}-he", mode="latency")
    plan = Plan.load(workdir / "models" / f"{args.series}-he" / "1")
    ring = SecretKeyring.generate(plan.parameters(), plan.galois_steps)  # the client's keys
    splits = make_splits(series, args.lookback, args.horizon)
    x = splits.scaler.inverse(splits.test.x[-1:])  # the client's last window, in its own units
    result = PlanEvaluator(plan, plan.parameters()).run(ring.encrypt(plan.encode_inputs(x)), ring.evaluation_keys())
    y = plan.decode_outputs(ring.decrypt(result), 1)
    plain = results[best].forecaster.predict_raw(x)
    print(f"encrypted forecast (N={plan.parameters().poly_modulus_degree}, {plan.levels} level): first steps "
          f"{np.round(y[0, :3, 0], 3).tolist()}, max |enc - plain| {np.abs(y - plain).max():.1e}")


if __name__ == "__main__":
    main()
