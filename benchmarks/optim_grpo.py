"""GRPO vs GRPO+AR vs GRPO+Lopti vs GRPO+AR+Lopti (and controls) on the toy sort task, same seeds and data.

Yang et al., "Do Not Let Low-Probability Tokens Over-Dominate in RL for LLMs" (ICLR 2026). Each seed warm-starts
one tiny Llama on noisy sorted targets (``veil.training.rl.toy``); every method starts from those weights and
sees the same training prompts, for the same number of RL steps (Lopti takes two optimizer steps per RL step, as
in the paper). Settings are the spec's (§8.4: group 8, temperature 0.7, clip 0.2/0.24, token-mean, k3 KL 0.001,
AR α 0.2 / 0.3 with Lopti, Lopti η 0.4 / 0.5 with AR) except the learning rate (3e-4: a tiny model, not 7B).
Target: AR and Lopti reach a higher reward than plain GRPO at equal steps. Writes docs/results/optim_grpo.json,
the optim_grpo section of docs/results.md and docs/img/optim_grpo_reward.png.

    python benchmarks/optim_grpo.py            # 6 configs x 3 seeds x 200 steps (8-12 min on one shared core)
    python benchmarks/optim_grpo.py --quick --out /tmp/docs   # smoke: 2 methods, 1 seed, 6 steps
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from veil.training.rl import GrpoConfig
from veil.training.rl.toy import ToySortConfig, build_policy, run_toy, warm_start

ROOT = Path(__file__).resolve().parents[1]
SECTION = "optim_grpo"
LR = 3e-4
# The spec's presets, plus a control: plain GRPO with two PPO epochs takes as many optimizer steps as Lopti.
CONFIGS = {m: GrpoConfig.preset(m, lr=LR) for m in ("grpo", "ar", "lopti", "ar_lopti", "lopti_reversed")}
CONFIGS["grpo_2epochs"] = GrpoConfig.preset("grpo", lr=LR, ppo_epochs=2)
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import argument_parser, command_line, environment, save_figure, save_results  # noqa: E402


def columns(history: list[dict[str, float]]) -> dict[str, list[float]]:
    """Per-step records as one rounded list per measure (step i is index i − 1), to keep the JSON small."""
    keys = ("reward", "low_prob_token_frac", "high_prob_direction")
    return {k: [round(h[k], 4) for h in history] for k in keys}


def summarise(runs: list[dict[str, Any]], methods: list[str], tail: int) -> list[dict[str, Any]]:
    """Per method: final held-out reward, training reward over the last ``tail`` steps and over all steps
    (mean ± std over seeds), the high-prob direction agreement and the first batch's low-token gradient share."""
    def stat(values: list[float]) -> tuple[float, float]:
        return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0

    rows = []
    for m in methods:
        rs = [r for r in runs if r["method"] == m]
        final = stat([r["eval"][-1][1] for r in rs])
        last = stat([statistics.fmean(r["history"]["reward"][-tail:]) for r in rs])
        auc = stat([statistics.fmean(r["history"]["reward"]) for r in rs])
        rows.append({"method": m, "eval_final_mean": final[0], "eval_final_std": final[1],
                     "train_last_mean": last[0], "train_last_std": last[1], "train_all_mean": auc[0],
                     "train_all_std": auc[1], "eval_start": statistics.fmean(r["eval"][0][1] for r in rs),
                     "high_prob_direction": statistics.fmean(statistics.fmean(r["history"]["high_prob_direction"])
                                                             for r in rs),
                     "seconds": statistics.fmean(r["seconds"] for r in rs)})
    return rows


def paired_gap(runs: list[dict[str, Any]], method: str, metric: str) -> str:
    """Per-seed difference to plain GRPO (same seed, same start, same prompts): mean ± std and how many seeds gain."""
    def value(r: dict[str, Any]) -> float:
        return r["eval"][-1][1] if metric == "eval" else statistics.fmean(r["history"]["reward"])

    base = {r["seed"]: value(r) for r in runs if r["method"] == "grpo"}
    gaps = [value(r) - base[r["seed"]] for r in runs if r["method"] == method]
    spread = statistics.stdev(gaps) if len(gaps) > 1 else 0.0
    return f"{statistics.fmean(gaps):+.3f} ± {spread:.3f} ({sum(g > 0 for g in gaps)}/{len(gaps)} seeds higher)"


def markdown(results: dict[str, Any], command: str) -> str:
    rows = {r["method"]: r for r in results["summary"]}
    lines = ["### GRPO vs Advantage Reweighting vs Lopti on the toy sort task", "",
             f"`{command}` — {results['environment']['date']}, {results['environment']['machine']}; seeds "
             f"{results['seeds']}, {results['settings']}. Reward = share of positions of the sorted list "
             "reproduced (held-out: 128 prompts never trained on, 2 samples each at T = 0.7). Mean ± std over seeds.",
             "", "| method | held-out reward, start | held-out reward, final | train reward, last "
             f"{results['tail']} steps | train reward, all steps | high-prob tokens moved the advantage's way | "
             "s / run |", "|---|---|---|---|---|---|---|"]
    for m, r in rows.items():
        lines.append(f"| {m} | {r['eval_start']:.3f} | {r['eval_final_mean']:.3f} ± {r['eval_final_std']:.3f} | "
                     f"{r['train_last_mean']:.3f} ± {r['train_last_std']:.3f} | {r['train_all_mean']:.3f} ± "
                     f"{r['train_all_std']:.3f} | {100 * r['high_prob_direction']:.1f} % | {r['seconds']:.0f} |")
    share = results["initial_gradient_share"]
    lines += ["", f"First batch, low-probability tokens' (π_old < 0.5) share of the gradient norm: plain "
              f"{share['plain']:.3f}, with AR (α = 0.2) {share['ar']:.3f} (mean over seeds).", ""]
    lines += ["Paired difference to plain GRPO at equal RL steps (per seed: same start, same prompts; mean ± std "
              "over seeds):", "", "| method | held-out reward, final | train reward, all steps |", "|---|---|---|"]
    for m in [m for m in results["methods"] if m != "grpo"]:
        lines.append(f"| {m} | {paired_gap(results['runs'], m, 'eval')} | {paired_gap(results['runs'], m, 'train')} |")
    lines += ["", "grpo_2epochs is plain GRPO with two PPO epochs: the same number of optimizer steps per RL step as "
              "Lopti.", "",
              "![reward vs step](img/optim_grpo_reward.png)"]
    return "\n".join(lines)


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for m in results["methods"]:
        rs = [r for r in results["runs"] if r["method"] == m]
        steps = list(range(1, len(rs[0]["history"]["reward"]) + 1))
        train = [statistics.fmean(r["history"]["reward"][i] for r in rs) for i in range(len(steps))]
        k = max(1, len(steps) // 20)  # moving average over ~5 % of the run
        smooth = [statistics.fmean(train[max(0, i - k + 1):i + 1]) for i in range(len(train))]
        axes[0].plot(steps, smooth, label=m, ls="--" if m in ("lopti_reversed", "grpo_2epochs") else "-")
        ev = [statistics.fmean(r["eval"][j][1] for r in rs) for j in range(len(rs[0]["eval"]))]
        axes[1].plot([e[0] for e in rs[0]["eval"]], ev, marker="o", ms=3, label=m,
                     ls="--" if m in ("lopti_reversed", "grpo_2epochs") else "-")
    axes[0].set_title(f"training reward (mean of {len(results['seeds'])} seeds, moving avg {k})")
    axes[1].set_title("held-out reward (128 prompts x 2 samples)")
    for ax in axes:
        ax.set_xlabel("RL step")
        ax.grid(alpha=0.3)
        ax.legend()
    axes[0].set_ylabel("reward")
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="a smoke run: grpo and ar_lopti, one seed, 6 steps")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=200, help="RL steps per run")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    methods, seeds, steps = list(CONFIGS), args.seeds, args.steps
    task = ToySortConfig()
    if args.quick:
        methods, seeds, steps, task = ["grpo", "ar_lopti"], args.seeds[:1], 6, task.replace(warm_steps=20)
    prompts_per_step, tail = 16, max(1, steps // 10)
    runs, shares = [], []
    for seed in seeds:
        policy = build_policy(task, seed)
        warm_start(policy, task, seed)
        state = {k: v.clone() for k, v in policy.state_dict().items()}
        for m in methods:
            t0 = time.perf_counter()
            out = run_toy(task, CONFIGS[m], steps, prompts_per_step, seed, policy_state=state)
            runs.append({"method": m, "seed": seed, "history": columns(out["history"]), "eval": out["eval"],
                         "optimizer_steps_per_rl_step": out["history"][0]["optimizer_steps"],
                         "seconds": time.perf_counter() - t0})
            if m == "grpo":
                shares.append(out["initial_gradient_share"])
            print(f"{m} seed {seed}: held-out {out['eval'][0][1]:.3f} -> {out['eval'][-1][1]:.3f} "
                  f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    results = {"methods": methods, "seeds": seeds, "steps": steps, "tail": tail, "task": task.to_dict(),
               "grpo_config": {m: CONFIGS[m].to_dict() for m in methods},
               "settings": f"{steps} RL steps x {prompts_per_step} prompts x group 8, lr {LR:g}, sort {task.length} "
                           f"of {task.num_symbols} symbols, Llama {task.layers}x{task.hidden_size}, warm start "
                           f"{task.warm_steps} steps at noise {task.noise}",
               "initial_gradient_share": {k: statistics.fmean(s[k] for s in shares) for k in ("plain", "ar")},
               "runs": runs, "summary": summarise(runs, methods, tail),
               "environment": environment("1 thread", torch=torch.__version__)}
    plot(results, args.out / "img" / "optim_grpo_reward.png")
    command = command_line(__file__, argv)
    save_results(args.out, SECTION, results, markdown(results, command))
    print(json.dumps(results["summary"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
