"""The closed forms against their identities, the spec's calibrated synthetic checks (§7), Root Purge's torch
trainer against its fixed point, and the collapse of the whole forecaster into one affine map."""

from __future__ import annotations

import numpy as np
import pytest
from veil.training.forecast import (
    ForecastDataConfig,
    ForecastFitConfig,
    ForecastModelConfig,
    NotAffineError,
    characteristic_roots,
    fit,
    make_splits,
    predictor_polynomial,
    root_counts,
    synthetic_series,
)
from veil.training.forecast.diagnostics import one_step_weights
from veil.training.forecast.linear import dwrr, rrr

from veil.config import ConfigError


@pytest.fixture(scope="module")
def regression() -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 12))
    y = x @ rng.normal(size=(12, 3)) @ rng.normal(size=(3, 8)) + 0.3 * rng.normal(size=(300, 8))
    return x[:200], y[:200], x[200:], y[200:]


def test_rrr_pythagoras_eckart_young_and_below_dwrr(regression) -> None:
    x, y, xv, yv = regression
    w_ols = np.linalg.lstsq(x, y, rcond=None)[0]
    fitted = x @ w_ols
    sigma = np.linalg.svd(fitted, compute_uv=False)
    base = ((y - fitted) ** 2).sum()
    for rank in range(1, 9):
        config = ForecastFitConfig(fit="rrr", rank=rank)
        w_rrr, info = rrr(x, y, xv, yv, config, horizon=8, bias=False)
        sse = ((y - x @ w_rrr) ** 2).sum()
        assert info["rank"] == rank
        assert abs(sse - (base + (sigma[rank:] ** 2).sum())) / sse < 1e-10
        w_dwrr, _ = dwrr(x, y, xv, yv, config.replace(fit="dwrr"), horizon=8, bias=False)
        assert sse <= ((y - x @ w_dwrr) ** 2).sum() + 1e-9


def test_dwrr_is_the_svd_truncation_and_validation_picks_the_rank(regression) -> None:
    x, y, xv, yv = regression
    u, s, vt = np.linalg.svd(np.linalg.lstsq(x, y, rcond=None)[0], full_matrices=False)
    w, _ = dwrr(x, y, xv, yv, ForecastFitConfig(fit="dwrr", rank=2), horizon=8, bias=False)
    np.testing.assert_allclose(w, (u[:, :2] * s[:2]) @ vt[:2], atol=1e-12)
    assert np.linalg.matrix_rank(w) == 2
    _, info = rrr(x, y, xv, yv, ForecastFitConfig(fit="rrr"), horizon=8, bias=False)
    curve = info["val_mse_by_rank"]
    assert info["rank"] == min(curve, key=curve.get) == 3  # the true rank
    refit = [((yv - xv @ rrr(x, y, xv, yv, ForecastFitConfig(fit="rrr", rank=r), 8, False)[0]) ** 2).mean()
             for r in (1, 3, 8)]
    np.testing.assert_allclose(refit, [curve[1], curve[3], curve[8]], rtol=1e-9)  # the closed-form curve


@pytest.mark.parametrize("lookback", [8, 12, 24])
def test_noise_free_predictor_vanishes_at_the_true_roots(lookback: int) -> None:
    series = synthetic_series(800, sigma=0.0)
    model = ForecastModelConfig(lookback=lookback, horizon=1, instance_norm="none")
    splits = make_splits(series, lookback, 1, ForecastDataConfig(standardize=False))
    forecaster = fit(splits, model, ForecastFitConfig(fit="ols"))
    w = one_step_weights(forecaster)[0]
    p = predictor_polynomial(w)
    roots = [np.exp(1j * a) for a in (0.02, -0.02, 0.05, -0.05)]
    assert max(abs(np.polyval(p, r)) for r in roots) < 1e-9
    assert abs(np.polyval(p, 1.0)) < 1e-9 and abs(np.polyval(np.polyder(p), 1.0)) < 1e-9  # double root at 1 (trend)


@pytest.fixture(scope="module")
def noisy_splits():
    """The spec's noisy series: 6000 points, σ = 0.5, 50/25/25, L = H = 336 (§7.3)."""
    return make_splits(synthetic_series(6000, sigma=0.5, seed=0), 336, 336,
                       ForecastDataConfig(split=[0.5, 0.25, 0.25], standardize=False, context=False))


def test_noisy_synthetic_rrr_and_root_purge_beat_ols(noisy_splits) -> None:
    model = ForecastModelConfig(lookback=336, horizon=336, instance_norm="mean")
    test_mse = {}
    for name, config in {"ols": ForecastFitConfig(fit="ols"), "rrr": ForecastFitConfig(fit="rrr"),
                         "rp1": ForecastFitConfig(fit="rootpurge", rp_solver="fixed_point", rp_lambda=1.0),
                         "rp2": ForecastFitConfig(fit="rootpurge", rp_solver="fixed_point", rp_lambda=2.0)}.items():
        forecaster = fit(noisy_splits, model, config)
        pred = forecaster.predict(noisy_splits.test.x)
        test_mse[name] = float(((pred - noisy_splits.test.y) ** 2).mean())
        if name == "rrr":
            assert 4 <= forecaster.info["rank"][0] <= 8  # six true roots
        singular = forecaster.singular_values()[0]
        test_mse[name + "_sv"] = (int((singular > 0.01 * singular[0]).sum()), singular[:3])
    assert test_mse["rrr"] <= 0.95 * test_mse["ols"]
    assert test_mse["rp2"] <= 0.97 * test_mse["ols"]
    counts = [test_mse[k + "_sv"][0] for k in ("ols", "rp1", "rp2")]
    assert counts[0] > counts[1] > counts[2]  # the purge shrinks the spectrum as λ grows
    top = [test_mse[k + "_sv"][1] for k in ("ols", "rp1", "rp2")]
    assert np.all(np.abs(top[2] / top[0] - 1) < 0.05)  # ... while the top 3 singular values stay


def test_torch_root_purge_reaches_the_fixed_point() -> None:
    splits = make_splits(synthetic_series(800, step=0.05, sigma=0.5, seed=1), 24, 24,
                         ForecastDataConfig(split=[0.6, 0.2, 0.2]))
    model = ForecastModelConfig(lookback=24, horizon=24, instance_norm="mean")
    target = fit(splits, model, ForecastFitConfig(fit="rootpurge", rp_solver="fixed_point", rp_lambda=0.5))
    ols = fit(splits, model, ForecastFitConfig(fit="ols"))
    trained = fit(splits, model, ForecastFitConfig(fit="rootpurge", rp_lambda=0.5, batch_size=0, steps=400,
                                                   lr=5e-3, rp_init="ols"))
    distance = np.linalg.norm(trained.weight - target.weight) / np.linalg.norm(target.weight)
    assert distance < 1e-2
    assert np.linalg.norm(ols.weight - target.weight) / np.linalg.norm(target.weight) > 0.1  # λ matters


@pytest.mark.parametrize("lookback,horizon,channels", [(12, 4, "mixed"), (4, 6, "individual"), (8, 8, "shared")])
def test_torch_root_purge_runs_every_layout(lookback: int, horizon: int, channels: str) -> None:
    rng = np.random.default_rng(0)
    t = np.arange(300)
    from veil.training.forecast import Series

    series = Series(np.stack([np.sin(t / 4), np.cos(t / 9)], 1) + 0.1 * rng.normal(size=(300, 2)), ["a", "b"], [])
    splits = make_splits(series, lookback, horizon)
    model = ForecastModelConfig(lookback=lookback, horizon=horizon, channels=channels, instance_norm="revin",
                                revin_affine=channels == "mixed", bias=channels == "individual")
    forecaster = fit(splits, model, ForecastFitConfig(fit="rootpurge", steps=60, lr=1e-2, batch_size=0,
                                                      rp_target="model_zero"))
    assert forecaster.info["final_loss"] < forecaster.info["first_loss"]
    assert forecaster.predict(splits.test.x).shape == splits.test.y.shape


LAYOUTS = [(c, n, b) for c in ("shared", "individual", "mixed") for n in ("none", "mean", "revin") for b in (False, True)]


@pytest.mark.parametrize("channels,norm,bias", LAYOUTS)
def test_the_whole_forecaster_is_one_affine_map(channels: str, norm: str, bias: bool) -> None:
    rng = np.random.default_rng(1)
    t = np.arange(200)
    from veil.training.forecast import Series

    series = Series(np.stack([3 + np.sin(t / 5), 10 * np.cos(t / 3)], 1) + rng.normal(size=(200, 2)), ["a", "b"], [])
    model = ForecastModelConfig(lookback=10, horizon=3, channels=channels, instance_norm=norm, bias=bias)
    splits = make_splits(series, 10, 3)
    forecaster = fit(splits, model, ForecastFitConfig(fit="rrr"))
    if norm == "revin" and (bias or channels == "mixed"):  # the window's std no longer cancels
        with pytest.raises(NotAffineError, match="normalise on the client"):
            forecaster.affine()
        return
    a, c = forecaster.affine()
    x = series.values[None, :10] + rng.normal(size=(4, 10, 2))
    want = forecaster.predict_raw(x).reshape(4, -1)
    assert np.abs(x.reshape(4, -1) @ a + c - want).max() < 1e-10 * np.abs(want).max()
    if norm != "none":  # instance norm: a constant passes through, so z = 1 is a characteristic root
        assert all(root_counts(r)["on"] >= 1 for r in characteristic_roots(forecaster))


def test_configs_round_trip_json_and_name_bad_fields() -> None:
    for config in (ForecastModelConfig(lookback=7, channels="mixed", instance_norm="revin", revin_affine=True),
                   ForecastFitConfig(fit="rootpurge", rp_scale="paper", rp_target="model_zero", rank=3),
                   ForecastDataConfig(split=[0.6, 0.2, 0.2], context=False)):
        assert type(config).from_json(config.to_json()) == config
    with pytest.raises(ConfigError, match=r"ForecastFitConfig.fit: expected one of .*received 'lasso'"):
        ForecastFitConfig(fit="lasso")
    with pytest.raises(ConfigError, match=r"ForecastDataConfig.split: .*received \[0.5, 0.5, 0.5\]"):
        ForecastDataConfig(split=[0.5, 0.5, 0.5])
    with pytest.raises(ConfigError, match=r"ForecastModelConfig\.revin_affine"):
        ForecastModelConfig(revin_affine=True)
    with pytest.raises(ConfigError, match=r"ForecastFitConfig\.rp_order"):
        ForecastFitConfig(rp_solver="fixed_point", rp_order=2)
