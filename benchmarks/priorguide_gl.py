"""PriorGuide on Gaussian linear (2-D, 5-D, 10-D): guided vs unguided vs importance reweighting, against the
closed-form posterior, with the exact (analytic) score and with a trained score network.

Protocol (PriorGuide App. C.3.1, in miniature): training prior N(0, 0.1 I), x | θ ~ N(θ, 0.1 I) (sbibm). Test
priors per dimension d: mild N(μ, (0.5 s)²), strong N(μ, (0.2 s)²), mixture of two strong components with
π ~ U(0.2, 0.8), μ_i ~ U(−3s, 3s) with s = √0.1; one prior of each kind per d, ``--observations`` draws θ* ~ q and
x ~ p(x | θ*) each. Methods: PriorGuide (defaults: N = 25, N_L = 8, η = 0.5, Σ0|t from a 500-draw pilot, VJP
Jacobian), PriorGuide with the identity Jacobian (sbi's choice), PriorGuide with a *fitted* K = 10 ratio
(mixture priors), the unguided model, and SIR on 20 000 unguided draws (resampled to ``--draws``, its ESS
reported). Metrics vs the analytic posterior N(m', S'): C2ST (random forest, 100 trees, 5-fold; 0.5 ideal),
mean error ‖m̂ − m'‖/√tr S', covariance error ‖Ĉ − S'‖_F/‖S'‖_F. The network: the `veil train sampler` MLP
(3×128, 10 000 simulations, 20 000 steps), one per d. A curve: C2ST vs N_L for the paper's Σ0|t and the pilot
one (10-D strong prior). Timing: 1 000 draws at the defaults on 2 threads (median of 3).

    OMP_NUM_THREADS=2 python benchmarks/priorguide_gl.py             # ~15 min on 2 shared cores
    python benchmarks/priorguide_gl.py --quick --out /tmp/docs       # smoke: 2-D, one observation, tiny net
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from veil.posterior import Gaussian, GaussianLinearScore, Mixture, Prior, PriorGuidePosterior, c2st
from veil.posterior.diagnostics import sir_report, sir_resample
from veil.training.priorguide import SamplerTrainConfig, ScoreNetConfig, get_task, train_score

from veil.progress import progress as progress_bar

ROOT = Path(__file__).resolve().parents[1]
SECTION = "priorguide_gl"
S = math.sqrt(0.1)
from common import save_figure, save_results  # noqa: E402


def test_priors(d: int, seed: int, spread: float = 3.0) -> dict[str, Prior]:
    """One mild, one strong and one mixture prior (App. C.3.1: μ_i ~ U(−3s, 3s), ``spread`` = 3) for dimension d."""
    gen = torch.Generator().manual_seed(1000 + d + seed)

    def mu() -> torch.Tensor:
        return (torch.rand(d, generator=gen, dtype=torch.float64) * 2 - 1) * spread * S

    pi = 0.2 + 0.6 * float(torch.rand(1, generator=gen))
    return {"mild": Gaussian.diag(mu(), [0.5 * S] * d), "strong": Gaussian.diag(mu(), [0.2 * S] * d),
            "mixture": Mixture([pi, 1 - pi], [Gaussian.diag(mu(), [0.2 * S] * d), Gaussian.diag(mu(), [0.2 * S] * d)])}


def analytic_posterior(prior: Prior, x: torch.Tensor, noise: torch.Tensor) -> Prior:
    """q(θ | x) in closed form for a Gaussian or a Gaussian mixture prior (weights ∝ π_k N(x | μ_k, Σ_k + Σ_x))."""
    from veil.posterior.score import gaussian_linear_posterior

    comps = [prior] if isinstance(prior, Gaussian) else prior.components
    weights = torch.ones(1, dtype=torch.float64) if isinstance(prior, Gaussian) else prior.weights
    lik = torch.stack([Gaussian(c.loc, c.cov + noise).log_prob(x[None])[0] for c in comps])
    posts = [gaussian_linear_posterior(c, noise, x) for c in comps]
    return posts[0] if len(posts) == 1 else Mixture(torch.softmax(weights.log() + lik, 0), posts)


def metrics(draws: torch.Tensor, target: Prior, ref: torch.Tensor, trees: int) -> dict[str, float]:
    cov = target.covariance()
    return {"c2st": round(c2st(ref, draws, trees=trees), 4),
            "mean_err": round(float((draws.mean(0) - target.mean()).norm() / cov.trace().sqrt()), 4),
            "cov_err": round(float(torch.linalg.norm(torch.cov(draws.T) - cov) / torch.linalg.norm(cov)), 4)}


def evaluate(post: PriorGuidePosterior, train: Prior, d: int, args: argparse.Namespace, label: str
             ) -> list[dict[str, Any]]:
    """Every method on every (prior kind, observation) of dimension ``d``."""
    noise = 0.1 * torch.eye(d, dtype=torch.float64)
    rows = []
    priors = test_priors(d, 0, args.spread)
    cells = [(kind, q, o) for kind, q in priors.items() for o in range(args.observations)]
    for kind, q, o in progress_bar(cells, desc=f"{label} {d}-d", leave=False):
        gen = torch.Generator().manual_seed(100 * d + o)
        x = q.sample(1, gen)[0] + S * torch.randn(d, generator=gen, dtype=torch.float64)
        target = analytic_posterior(q, x, noise)
        ref = target.sample(args.draws, gen)
        guided = post.sample((args.draws,), x=x, prior=q, seed=o)
        variants = {"priorguide": guided.theta,
                    "identity_jacobian": post.sample((args.draws,), x=x, prior=q, seed=o, jacobian="identity").theta}
        if kind == "mixture":
            fitted = post.sample((args.draws,), x=x, prior=q, seed=o, ratio="fit", k=10)
            variants["priorguide_fit"] = fitted.theta
        base = post.sample((args.sir_base,), x=x, seed=o, langevin_steps=0).theta
        variants["unguided"] = base[:args.draws]
        variants["sir"] = sir_resample(base, train, q, args.draws, seed=o)
        row = {"scores": label, "d": d, "prior": kind, "obs": o, "ood": guided.diagnostics["ood"]["fraction"],
               "sir_report": sir_report(base, train, q), "nfe": guided.diagnostics["nfe"]}
        if kind == "mixture":
            row["fit_error"] = fitted.diagnostics["ratio"]["fit_error"]
        for name, draws in variants.items():
            row[name] = metrics(draws, target, ref, args.trees)
        rows.append(row)
    return rows


def langevin_curve(post: PriorGuidePosterior, d: int, args: argparse.Namespace, label: str) -> dict[str, list]:
    """C2ST vs N_L (N = 25) for the paper's Σ0|t and the pilot's, strong prior, averaged over observations."""
    noise = 0.1 * torch.eye(d, dtype=torch.float64)
    q = test_priors(d, 0, args.spread)["strong"]
    out: dict[str, list] = {"n_l": list(args.curve)}
    for kernel in ("paper", "full"):
        values = []
        for n_l in args.curve:
            scores = []
            for o in range(args.observations):
                gen = torch.Generator().manual_seed(100 * d + o)
                x = q.sample(1, gen)[0] + S * torch.randn(d, generator=gen, dtype=torch.float64)
                target = analytic_posterior(q, x, noise)
                draws = post.sample((args.draws,), x=x, prior=q, seed=o, langevin_steps=n_l, kernel=kernel).theta
                scores.append(c2st(target.sample(args.draws, gen), draws, trees=args.trees))
            values.append(round(statistics.mean(scores), 4))
        out[kernel] = values
    return out


def timing(post: PriorGuidePosterior, d: int, threads: int, draws: int, repeats: int) -> dict[str, Any]:
    """Median seconds of ``draws`` draws at the defaults (N = 25, N_L = 8, 500-draw pilot) and without the pilot;
    the 1-minute load average is recorded because the machine may be shared."""
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    q = test_priors(d, 0)["strong"]
    x = q.mean()
    out: dict[str, Any] = {"d": d, "threads": threads, "draws": draws, "load_average": round(os.getloadavg()[0], 2)}
    for name, kw in (("defaults", {}), ("no_pilot", {"pilot": 0, "kernel": "paper"})):
        post.sample((draws,), x=x, prior=q, **kw)  # warm-up (and ratio, OOD threshold caches)
        times, diag = [], {}
        for seed in range(repeats):
            start = time.perf_counter()
            diag = post.sample((draws,), x=x, prior=q, seed=seed, **kw).diagnostics
            times.append(time.perf_counter() - start)
        out[name] = {"seconds": round(statistics.median(times), 3), "nfe": diag["nfe"],
                     "pilot_nfe": diag.get("pilot", {}).get("nfe", 0)}
    torch.set_num_threads(old)
    return out


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean over observations per (scores, d, prior)."""
    groups: dict[tuple, list] = {}
    for r in rows:
        groups.setdefault((r["scores"], r["d"], r["prior"]), []).append(r)
    out = []
    for (scores, d, prior), rs in groups.items():
        entry: dict[str, Any] = {"scores": scores, "d": d, "prior": prior,
                                 "ood": round(statistics.mean(r["ood"] for r in rs), 4),
                                 "sir_ess": round(statistics.mean(r["sir_report"]["ess"] for r in rs), 1)}
        for m in ("priorguide", "identity_jacobian", "priorguide_fit", "unguided", "sir"):
            if m in rs[0]:
                entry[m] = {k: round(statistics.mean(r[m][k] for r in rs), 3) for k in ("c2st", "mean_err", "cov_err")}
        out.append(entry)
    return out


def table(summary: list[dict[str, Any]]) -> str:
    head = ("| scores | d | prior | PriorGuide C2ST | identity-Jacobian C2ST | fitted-ratio C2ST | unguided C2ST | "
            "SIR C2ST | SIR ESS (of 20k) | PriorGuide mean err | SIR mean err | PriorGuide cov err | SIR cov err | "
            "OOD |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for e in summary:
        fit = e["priorguide_fit"]["c2st"] if "priorguide_fit" in e else "–"
        lines.append(f"| {e['scores']} | {e['d']} | {e['prior']} | **{e['priorguide']['c2st']:.3f}** | "
                     f"{e['identity_jacobian']['c2st']:.3f} | {fit} | {e['unguided']['c2st']:.3f} | "
                     f"{e['sir']['c2st']:.3f} | {e['sir_ess']} | {e['priorguide']['mean_err']:.3f} | "
                     f"{e['sir']['mean_err']:.3f} | {e['priorguide']['cov_err']:.3f} | {e['sir']['cov_err']:.3f} | "
                     f"{e['ood']} |")
    return "\n".join(lines)


def targets(summary: list[dict[str, Any]], times: list[dict[str, Any]]) -> list[str]:
    exact = [e["priorguide"]["c2st"] for e in summary if e["scores"] == "analytic"]
    net = [e for e in summary if e["scores"] == "network"]
    low_ess = [e for e in net if e["sir_ess"] < 100]
    beats = sum(e["priorguide"]["c2st"] < e["sir"]["c2st"] for e in low_ess)
    lines = [f"- exact scores, PriorGuide C2ST <= 0.55: worst cell {max(exact):.3f} "
             f"({'met' if max(exact) <= 0.55 else 'MISSED'})"]
    if net:
        worst = max(e["priorguide"]["c2st"] for e in net)
        lines.append(f"- trained network, PriorGuide C2ST <= 0.65: worst cell {worst:.3f} "
                     f"({'met' if worst <= 0.65 else 'MISSED'}); better than SIR in {beats} of {len(low_ess)} cells "
                     "where SIR's ESS < 100")
    for t in times:
        ok = t["defaults"]["seconds"] <= 2.0
        lines.append(f"- {t['draws']} draws <= 2 s on {t['threads']} thread(s) ({t['scores']} score, {t['d']}-d, "
                     f"load average {t['load_average']}): {t['defaults']['seconds']} s at NFE {t['defaults']['nfe']} "
                     f"+ pilot {t['defaults']['pilot_nfe']} ({'met' if ok else 'MISSED'}); "
                     f"{t['no_pilot']['seconds']} s without the pilot")
    return lines


def plot(curves: dict[str, dict[str, list]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(curves), figsize=(5 * len(curves), 3.6), squeeze=False)
    for ax, (label, curve) in zip(axes[0], curves.items(), strict=True):
        ax.plot(curve["n_l"], curve["paper"], "o-", label="Σ0|t = σ²/(1+σ²) I (paper)")
        ax.plot(curve["n_l"], curve["full"], "s-", label="Σ0|t from pilot covariance (veil default)")
        ax.axhline(0.5, color="grey", lw=0.8, ls=":")
        ax.set(xlabel="Langevin steps N_L (N = 25)", ylabel="C2ST vs analytic posterior", title=label)
        ax.legend(fontsize=8)
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", type=int, nargs="+", default=[2, 5, 10])
    parser.add_argument("--observations", type=int, default=3)
    parser.add_argument("--draws", type=int, default=1000)
    parser.add_argument("--sir-base", type=int, default=20_000)
    parser.add_argument("--trees", type=int, default=100)
    parser.add_argument("--train-steps", type=int, default=20_000)
    parser.add_argument("--simulations", type=int, default=10_000)
    parser.add_argument("--curve", type=int, nargs="+", default=[0, 1, 2, 4, 8])
    parser.add_argument("--timing-threads", type=int, default=2)
    parser.add_argument("--timing-draws", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--spread", type=float, default=3.0,
                        help="test-prior means μ_i ~ U(−spread·s, spread·s) (the paper: 3)")
    parser.add_argument("--section", default=SECTION, help="results key (JSON file, results.md section, PNG)")
    parser.add_argument("--no-timing", action="store_true", help="skip the timing runs")
    parser.add_argument("--quick", action="store_true", help="smoke settings")
    parser.add_argument("--out", type=Path, default=ROOT / "docs")
    args = parser.parse_args(argv)
    if args.quick:
        args.dims, args.observations, args.draws, args.sir_base, args.trees = [2], 1, 200, 1000, 10
        args.train_steps, args.simulations, args.curve = 100, 1000, [0, 2]
        args.timing_draws, args.repeats, args.timing_threads = 100, 1, 1
    torch.set_num_threads(1)
    rows: list[dict[str, Any]] = []
    curves: dict[str, dict[str, list]] = {}
    times: list[dict[str, Any]] = []
    trained: dict[int, dict[str, Any]] = {}
    for d in args.dims:
        task = get_task("gaussian_linear", d)
        analytic = PriorGuidePosterior(GaussianLinearScore(task.prior, task.noise_cov), task.prior)
        rows += evaluate(analytic, task.prior, d, args, "analytic")
        theta, x = task.simulate_pairs(args.simulations, seed=0)
        result = train_score(theta, x, task.prior, ScoreNetConfig(dim=d, x_dim=d),
                             SamplerTrainConfig(simulations=args.simulations, steps=args.train_steps), progress=True)
        trained[d] = result.metrics
        network = result.posterior()
        rows += evaluate(network, task.prior, d, args, "network")
        if d == max(args.dims):
            curves[f"analytic score, {d}-d strong prior"] = langevin_curve(analytic, d, args, "analytic")
            curves[f"trained network, {d}-d strong prior"] = langevin_curve(network, d, args, "network")
            for threads in [] if args.no_timing else sorted({1, args.timing_threads}):
                for label, post in (("network", network), ("analytic", analytic)):
                    times.append({"scores": label, **timing(post, d, threads, args.timing_draws, args.repeats)})
    summary = summarise(rows)
    results = {"summary": summary, "rows": rows, "curves": curves, "timing": times, "training": trained,
               "settings": {k: v for k, v in vars(args).items() if k != "out"} | {"out": None},
               "machine": {"python": platform.python_version(), "torch": torch.__version__,
                           "processor": platform.processor() or platform.machine()}}
    plot(curves, args.out / "img" / f"{args.section}_langevin.png")
    body = "\n".join([
        f"## {args.section} — PriorGuide on Gaussian linear vs unguided and importance reweighting",
        "",
        f"`OMP_NUM_THREADS=2 python benchmarks/priorguide_gl.py {' '.join(argv or sys.argv[1:])}`. Training prior "
        "N(0, 0.1 I), x | θ ~ N(θ, 0.1 I); per d one mild, one strong and one mixture test prior (App. C.3.1, "
        f"means μ_i ~ U(−{args.spread:g}s, {args.spread:g}s)), "
        f"{args.observations} observation(s) each, {args.draws} draws per method, C2ST against the closed-form "
        "posterior (random forest, 0.5 = indistinguishable). PriorGuide at N = 25, N_L = 8 (225 NFE + a 25-NFE "
        f"500-draw pilot); SIR resamples {args.sir_base} unguided draws. Mean/cov errors: ‖m̂ − m'‖/√tr S' and "
        "‖Ĉ − S'‖_F/‖S'‖_F (means over observations). The network: 3×128 MLP, "
        f"{args.simulations} simulations, {args.train_steps} steps.",
        "",
        table(summary),
        "",
        "Targets:",
        "",
        *targets(summary, times),
        "",
        f"C2ST vs Langevin steps ({max(args.dims)}-D strong prior): ![C2ST vs N_L](img/{args.section}_langevin.png)",
        "",
        "| curve | N_L | " + " | ".join(str(n) for n in args.curve) + " |",
        "|---|---|" + "---|" * len(args.curve),
        *[f"| {label} | {kernel} | " + " | ".join(f"{v:.3f}" for v in curve[kernel]) + " |"
          for label, curve in curves.items() for kernel in ("paper", "full")],
    ])
    save_results(args.out, args.section, results, body)
    print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
