"""AdamW vs RACS vs Alice (and every other full-model veil optimizer) on the `veil train lm` byte-level Llama LM.

Gong, Scetbon, Ma, Meeds, "Towards Efficient Optimizer Design for LLM via Structured Fisher Approximation with a
Low-Rank Extension" (ICLR 2026): on LLaMA/C4, RACS beats Adam at ~40 % of its optimizer memory and Alice reaches
Adam's final perplexity in ~2x fewer steps. Here the same seed, text (pydoc topics, fixed held-out split), model
(tiny preset, 0.92 M parameters) and schedule (10 % warm-up, cosine to 10 %) are used for every optimizer; each
gets its lr from a small sweep on the first seed, picked by the lowest final *training* loss (mean of the last 10 %
of steps), and extended past any edge of its grid that wins, so the held-out text never chooses anything; further
seeds rerun the chosen configurations. Settings beyond the lr (VARIANTS: AdamW's β2, weight decay and an
lr between grid points; Alice's paper hyperparameters one at a time, then combined) run at the chosen lr and are
selected by the same rule, among configurations whose state fits the memory target; a control (AdamW with the
embeddings and norms at Alice's lr) is reported beside them. Targets: Alice reaches AdamW's final held-out loss in
<= 0.6x the steps; RACS ends within 5 % of AdamW's held-out loss (or below it); optimizer state <= 1/2 of Adam's.
Writes docs/results/optim_lm.json, docs/img/optim_lm_loss.png and the optim_lm section of docs/results.md.

    python benchmarks/optim_lm.py            # 900 steps, seed 0, 27 runs (about 100 min of training on 2 shared cores)
    python benchmarks/optim_lm.py --steps 300 --seeds 0 --cache /tmp/optim_lm   # the earlier, shorter setting
    python benchmarks/optim_lm.py --quick --out /tmp/docs   # smoke: micro preset, 30 steps, one lr each
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from veil.training.lm import PRESETS, LMModelConfig, LMTrainConfig, load_pydoc_topics, train_lm
from veil.training.lm.config import LM_LR, full_model_optimizers
from veil.training.lm.trainer import optimizer_kwargs

ROOT = Path(__file__).resolve().parents[1]
SECTION = "optim_lm"
from common import argument_parser, environment, save_figure, save_results  # noqa: E402

# lr grids: AdamW around its usual small-model range; RACS/Alice around the paper's λ = 0.02 (Tables 9, 11), RACS
# shifted up one point because 0.05, the top of its first grid {0.01, 0.02, 0.05}, won the 300-step sweep.
DEFAULT_STEPS = 900
DEFAULT_SEEDS = [0]
SWEEP: dict[str, list[float]] = {"adamw": [3e-4, 1e-3, 3e-3], "racs": [0.02, 0.05, 0.1], "alice": [0.01, 0.02, 0.05]}
# When the winner (by training loss) sits at an edge of its grid, the sweep adds the next value of this ladder
# beyond that edge, and again until the winner is inside the grid or the ladder ends.
LADDER: dict[str, list[float]] = {"adamw": [1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2],
                                  "racs": [0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5],
                                  "alice": [0.005, 0.01, 0.02, 0.05, 0.1, 0.2]}

# Settings beyond the lr, each run once at the lr the grid sweep chose (an "lr" key overrides it), with the same
# selection rule (lowest final training loss). Stage 1 was written down before anything ran: AdamW gets its usual
# alternatives (β2 = 0.95, weight decay 0.1, lr 2e-3 between its two best grid points); Alice gets one change at a
# time from the paper's settings: an Adam lr of 2e-3 for the embeddings and norms (AdamW's range; by default they
# share Alice's 0.02), Q̃ rotated into the new basis at a switch, K = 1 % of the steps, r = hidden/2 (r/d = 1/2; its
# state exceeds 1/2 of Adam's, so it is shown but not eligible), α_c = 0.8. Stage 2 (rule fixed before stage 1
# ended): the stage-1 changes that lowered the training loss together, the same with K = 5, and the better of the
# two at the neighbouring lrs 0.01 and 0.05. Stage 3 (added after seeing stages 1-2): α_c = 0.2 and an Adam lr of
# 0.05 on the best eligible configuration so far.
_ALICE_BEST = {"rotate_tracking": True, "update_interval": 9}
VARIANTS: dict[str, list[dict[str, Any]]] = {
    "adamw": [{"betas": [0.9, 0.95]}, {"weight_decay": 0.1}, {"lr": 2e-3}],
    "alice": [{"adam_lr": 2e-3}, {"rotate_tracking": True}, {"update_interval": 9}, {"rank": 64, "leading": 20},
              {"alpha_c": 0.8},
              _ALICE_BEST, {**_ALICE_BEST, "update_interval": 5}, {**_ALICE_BEST, "lr": 0.01},
              {**_ALICE_BEST, "lr": 0.05},
              {**_ALICE_BEST, "alpha_c": 0.2}, {**_ALICE_BEST, "adam_lr": 0.05}],
}
# Optimizers whose chosen configuration must keep its state within this share of AdamW's (the memory target).
STATE_LIMIT: dict[str, float] = {"racs": 0.5, "alice": 0.5}

# A control outside the selection: AdamW with the embeddings and norms at 0.02, the lr Alice and RACS give the
# parameters they train with Adam (matrix_param_groups), the linear weights at AdamW's grid lr. Alice's steps to
# its final held-out loss are reported beside the target's (against the selected AdamW).
CONTROL: dict[str, Any] = {"optimizer": "adamw", "lr": 1e-3, "optimizer_args": {"adam_lr": 0.02}}


@contextmanager
def adamw_split_lr() -> Iterator[None]:
    """Let ``build_optimizer("adamw", model, ..., adam_lr=x)`` (which the trainer calls) train the linear weights
    at ``lr`` and everything else (embeddings, norms) at ``x``, split as for RACS/Alice (``matrix_param_groups``)."""
    import veil.training.optim as optim

    original = optim.build_optimizer

    def build(name: str, model: Any, lr: float, adam_lr: float | None = None, **kwargs: Any) -> Any:
        if name != "adamw" or adam_lr is None:
            return original(name, model, lr=lr, **({} if adam_lr is None else {"adam_lr": adam_lr}), **kwargs)
        return torch.optim.AdamW(optim.matrix_param_groups(model, (), rest={"lr": adam_lr}), lr=lr, **kwargs)

    optim.build_optimizer = build
    try:
        yield
    finally:
        optim.build_optimizer = original


def variant_args(extra: dict[str, Any]) -> dict[str, Any]:
    """The optimizer arguments of a VARIANTS entry (everything but its ``lr``)."""
    return {k: v for k, v in extra.items() if k != "lr"}


def eligible(run: dict[str, Any], runs: list[dict[str, Any]]) -> bool:
    """A finished run whose state fits its optimizer's STATE_LIMIT share of an AdamW run's state."""
    if run["diverged"]:
        return False
    limit = STATE_LIMIT.get(run["optimizer"])
    adam = next((r for r in runs if r["optimizer"] == "adamw" and not r["diverged"]), None)
    return (limit is None or adam is None or run["metrics"]["optimizer_state_bytes"]
            <= limit * adam["metrics"]["optimizer_state_bytes"])


def choose(runs: list[dict[str, Any]], name: str, grid: list[float]) -> dict[str, Any]:
    """``name``'s eligible run with the lowest final training loss (every finished run if none is eligible)."""
    done = [r for r in runs if r["optimizer"] == name and not r["diverged"]]
    if not done:
        raise FloatingPointError(f"{name}: every lr of {grid} diverged")
    return min([r for r in done if eligible(r, runs)] or done, key=lambda r: r["select_train_loss"])


def run_one(name: str, lr: float, model: LMModelConfig, train: LMTrainConfig, corpus: Any,
            cache: Path | None = None, optimizer_args: dict[str, Any] | None = None) -> dict[str, Any]:
    """Train one optimizer at one lr (``optimizer_args``: its extra arguments); a diverged run is recorded (not
    raised) so the sweep goes on.

    With ``cache``, a run is stored as JSON under a hash of its full settings, the optimizer's resolved keyword
    arguments included, and read back instead of retrained (runs are deterministic: same seed, data and single
    thread), so an interrupted or extended benchmark resumes.
    """
    args = dict(optimizer_args or {})
    config = train.replace(optimizer=name, lr=lr, optimizer_args=args)
    key = json.dumps({"model": model.to_dict(), "train": config.to_dict(), "kwargs": optimizer_kwargs(model, config)},
                     sort_keys=True, default=str)
    path = None if cache is None else cache / f"{name}-{lr:g}-s{train.seed}-{hashlib.sha1(key.encode()).hexdigest()[:12]}.json"
    if path is not None and path.exists():
        return json.loads(path.read_text())
    try:
        with adamw_split_lr():
            result = train_lm(model, config, corpus, progress=False)
    except FloatingPointError as exc:
        run = {"optimizer": name, "lr": lr, "seed": train.seed, "optimizer_args": args, "diverged": str(exc)}
    else:
        tail = result.train_loss[-max(1, len(result.train_loss) // 10):]
        run = {"optimizer": name, "lr": lr, "seed": train.seed, "optimizer_args": args, "diverged": None,
               "select_train_loss": sum(tail) / len(tail), "metrics": dict(result.metrics),
               "history": result.history, "train_loss": result.train_loss}
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(run))
    return run


def sweep_lrs(name: str, grid: list[float], ladder: list[float] | None,
              run: Callable[[float], dict[str, Any]]) -> list[dict[str, Any]]:
    """Run every lr of ``grid``; while the lowest final training loss is at an edge, add the ladder's next lr."""
    runs = {lr: run(lr) for lr in grid}
    while ladder:
        done = {lr: r for lr, r in runs.items() if not r["diverged"]}
        if not done:
            break
        best = min(done, key=lambda lr: done[lr]["select_train_loss"])
        lrs = sorted(runs)
        if best == lrs[-1] and best in ladder and ladder.index(best) + 1 < len(ladder):
            nxt = ladder[ladder.index(best) + 1]
        elif best == lrs[0] and best in ladder and ladder.index(best) > 0:
            nxt = ladder[ladder.index(best) - 1]
        else:
            break
        runs[nxt] = run(nxt)
    return [runs[lr] for lr in sorted(runs)]


def steps_to_reach(history: list[dict[str, float]], target: float) -> int | None:
    """First evaluated step whose held-out loss is <= ``target`` (None: never)."""
    return next((h["step"] for h in history if h["held_out_loss"] <= target), None)


def steps_to_reach_interpolated(history: list[dict[str, float]], target: float) -> float | None:
    """Step where the held-out curve, linear between evaluations, first reaches ``target`` (None: never)."""
    prev = None
    for h in history:
        if h["held_out_loss"] <= target:
            if prev is None or prev["held_out_loss"] == h["held_out_loss"]:
                return float(h["step"])
            frac = (prev["held_out_loss"] - target) / (prev["held_out_loss"] - h["held_out_loss"])
            return prev["step"] + frac * (h["step"] - prev["step"])
        prev = h
    return None


def seed_rows(runs: dict[str, dict[str, Any]], steps: int) -> dict[str, dict[str, Any]]:
    """Per optimizer of one seed: final held-out loss and the steps to that seed's AdamW final held-out loss."""
    adam = runs["adamw"]["metrics"]["held_out_loss"]
    rows = {}
    for name, run in runs.items():
        if run["diverged"]:
            rows[name] = {"lr": run["lr"], "diverged": run["diverged"], "held_out_loss": None,
                          "steps_to_adamw_final": None, "step_ratio": None, "step_ratio_interpolated": None}
            continue
        reach = steps_to_reach(run["history"], adam)
        interp = steps_to_reach_interpolated(run["history"], adam)
        rows[name] = {"lr": run["lr"], "diverged": None, "held_out_loss": run["metrics"]["held_out_loss"],
                      "loss_vs_adamw": run["metrics"]["held_out_loss"] / adam - 1,
                      "select_train_loss": run["select_train_loss"], "steps_to_adamw_final": reach,
                      "step_ratio": None if reach is None else reach / steps,
                      "step_ratio_interpolated": None if interp is None else interp / steps}
    return rows


def sweep_entry(run: dict[str, Any], best: dict[str, dict[str, Any]], runs: list[dict[str, Any]],
                steps: int) -> dict[str, Any]:
    """One row of the table of every configuration: settings, selection loss and, for reference, held-out numbers."""
    entry = {"optimizer": run["optimizer"], "lr": run["lr"], "optimizer_args": run.get("optimizer_args", {}),
             "diverged": run["diverged"], "chosen": run is best[run["optimizer"]],
             "eligible": eligible(run, runs), "select_train_loss": run.get("select_train_loss")}
    if not run["diverged"]:
        adam = best["adamw"]["metrics"]
        reach = steps_to_reach(run["history"], adam["held_out_loss"])
        interp = steps_to_reach_interpolated(run["history"], adam["held_out_loss"])
        entry.update(held_out_loss=run["metrics"]["held_out_loss"],
                     state_vs_adamw=run["metrics"]["optimizer_state_bytes"] / adam["optimizer_state_bytes"],
                     steps_to_adamw_final=reach, step_ratio=None if reach is None else reach / steps,
                     step_ratio_interpolated=None if interp is None else interp / steps)
    return entry


def control_entry(control: dict[str, Any] | None, best: dict[str, dict[str, Any]],
                  steps: int) -> dict[str, Any] | None:
    """The control run's final losses and the steps each chosen optimizer needs to reach its final held-out loss."""
    if control is None or control["diverged"]:
        return None if control is None else {**CONTROL, "diverged": control["diverged"]}
    final = control["metrics"]["held_out_loss"]
    reach = {}
    for name, run in best.items():
        at = steps_to_reach(run["history"], final)
        interp = steps_to_reach_interpolated(run["history"], final)
        reach[name] = {"steps": at, "step_ratio": None if at is None else at / steps,
                       "step_ratio_interpolated": None if interp is None else interp / steps}
    return {**CONTROL, "diverged": None, "select_train_loss": control["select_train_loss"], "held_out_loss": final,
            "reach": reach, "history": control["history"]}


def summarise(best: dict[str, dict[str, Any]], steps: int,
              per_seed: dict[int, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """Final losses, memory ratios and the three targets, all against the AdamW run.

    ``best`` is the first seed's runs at the chosen lrs (the table's rows); ``per_seed`` holds every seed's rows
    (seed_rows). The step and loss targets count as met only if they are met on every seed.
    """
    adam = best["adamw"]["metrics"]
    rows = {}
    for name, run in best.items():
        m = run["metrics"]
        reach = steps_to_reach(run["history"], adam["held_out_loss"])
        interp = steps_to_reach_interpolated(run["history"], adam["held_out_loss"])
        rows[name] = {"lr": run["lr"], "held_out_loss": m["held_out_loss"], "held_out_perplexity": m["held_out_perplexity"],
                      "loss_vs_adamw": m["held_out_loss"] / adam["held_out_loss"] - 1,
                      "optimizer_state_bytes": m["optimizer_state_bytes"],
                      "state_vs_adamw": m["optimizer_state_bytes"] / adam["optimizer_state_bytes"],
                      "steps_to_adamw_final": reach, "step_ratio": None if reach is None else reach / steps,
                      "step_ratio_interpolated": None if interp is None else interp / steps,
                      "train_seconds": m["train_seconds"], "optimizer_kwargs": m["optimizer_kwargs"]}
    targets = {}
    seeds = list(per_seed.values())
    if "alice" in rows:
        targets["alice_steps_to_adamw_final <= 0.6x"] = all(
            r["alice"]["step_ratio"] is not None and r["alice"]["step_ratio"] <= 0.6 for r in seeds)
    if "racs" in rows:
        targets["racs_loss <= 1.05x adamw"] = all(
            r["racs"]["held_out_loss"] is not None and r["racs"]["loss_vs_adamw"] <= 0.05 for r in seeds)
    for name in ("racs", "alice"):
        if name in rows:
            targets[f"{name}_state <= 1/2 adam"] = rows[name]["state_vs_adamw"] <= 0.5
    means = {}
    for name in rows:
        ratios = [r[name]["step_ratio"] for r in seeds]
        interps = [r[name]["step_ratio_interpolated"] for r in seeds]
        losses = [r[name]["held_out_loss"] for r in seeds]
        means[name] = {"held_out_loss": None if None in losses else sum(losses) / len(losses),
                       "step_ratio": None if None in ratios else sum(ratios) / len(ratios),
                       "step_ratio_interpolated": None if None in interps else sum(interps) / len(interps)}
    return {"rows": rows, "targets": targets, "seeds": {str(k): v for k, v in per_seed.items()}, "seed_means": means}


def plot(best: dict[str, dict[str, Any]], adam_final: float, path: Path,
         seed_curves: dict[str, dict[str, dict[str, Any]]] | None = None) -> None:
    """Held-out loss vs step (left; further seeds thin) and smoothed training loss (right) at the chosen lrs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for name, run in best.items():
        line, = ax1.plot([h["step"] for h in run["history"]], [h["held_out_loss"] for h in run["history"]],
                         marker=".", label=f"{name} (lr {run['lr']:g})")
        for runs in (seed_curves or {}).values():
            if name in runs:
                hist = runs[name]["history"]
                ax1.plot([h["step"] for h in hist], [h["held_out_loss"] for h in hist], color=line.get_color(),
                         linewidth=0.8, alpha=0.6, linestyle=":")
        loss = torch.tensor(run["train_loss"])
        k = max(1, len(loss) // 40)
        smooth = loss.unfold(0, k, 1).mean(1) if len(loss) >= k else loss  # moving average over k steps
        ax2.plot(range(k, len(loss) + 1), smooth.tolist(), label=name)
    ax1.axhline(adam_final, color="grey", linestyle="--", linewidth=0.8, label="AdamW final")
    if seed_curves:
        ax1.plot([], [], color="grey", linestyle=":", linewidth=0.8, label="other seeds")
    for ax, title in ((ax1, "held-out loss (nats/byte)"), (ax2, "training loss (moving average)")):
        ax.set_xlabel("step")
        ax.set_title(title)
        ax.set_ylim(top=min(ax.get_ylim()[1], 3.5))
        ax.legend()
    save_figure(fig, path)


def _ratio(r: dict[str, Any]) -> str:
    if r["steps_to_adamw_final"] is None:
        return "never"
    interp = r.get("step_ratio_interpolated")
    return f"{r['steps_to_adamw_final']} ({r['step_ratio']:.2f}x" + (
        f"; {interp:.2f}x interpolated)" if interp is not None else ")")


def markdown(results: dict[str, Any], command: str) -> str:
    s = results["settings"]
    summary = results["summary"]
    seeds = s["seeds"]
    lines = [f"### Optimizers on the byte-level Llama LM ({s['preset']}, {s['parameters']:,} parameters)", "",
             f"`{command}` — {results['environment']['date']}, {results['environment']['machine']}, torch threads 1, "
             f"{results['train_seconds_total'] / 60:.0f} min of training in all; seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}; "
             f"{s['steps']} steps of "
             f"{s['batch_size']} x {s['block_size']} bytes, warm-up "
             f"{s['warmup']:.0%} + cosine to {s['min_lr_ratio']:.0%}, held-out = {s['held_out_bytes']:,} bytes of "
             f"pydoc topics ({s['eval_blocks']} evenly spaced windows per evaluation, every {s['eval_every']} steps). "
             f"Each optimizer's lr is the one of its sweep (seed {s['sweep_seed']}) with the lowest final *training* "
             "loss (mean of the last 10 % of steps); the held-out text chooses nothing. Grids: " +
             "; ".join(f"{n} {{{', '.join(f'{lr:g}' for lr in g)}}}" for n, g in s["sweep"].items()) +
             (", each extended by the next value of a ladder beyond any edge that wins (swept: " +
              "; ".join(f"{n} {{{', '.join(f'{lr:g}' for lr in g)}}}" for n, g in s["swept"].items()) + ")"
              if s.get("ladder") else "") + "." +
             (f" Seed{'s' if len(seeds) > 2 else ''} {', '.join(map(str, seeds[1:]))} rerun{'' if len(seeds) > 2 else 's'} "
              "the chosen lrs only." if len(seeds) > 1 else ""),
             "", f"Seed {seeds[0]}:", "",
             "| optimizer | lr | held-out loss | perplexity | vs AdamW | state (bytes) | state vs AdamW | "
             "steps to AdamW's final (ratio) | seconds |", "|---|---|---|---|---|---|---|---|---|"]
    for name, r in summary["rows"].items():
        lines.append(f"| {name} | {r['lr']:g} | {r['held_out_loss']:.4f} | {r['held_out_perplexity']:.3f} | "
                     f"{100 * r['loss_vs_adamw']:+.1f} % | {r['optimizer_state_bytes']:,} | "
                     f"{r['state_vs_adamw']:.2f} | {_ratio(r)} | {r['train_seconds']:.0f} |")
    lines += ["", "The step ratio is the first evaluation (every "
              f"{s['eval_every']} steps) at or below the same seed's final AdamW held-out loss, over {s['steps']}; "
              "\"interpolated\" reads the crossing off the held-out curve drawn straight between evaluations."]
    if len(seeds) > 1:
        lines += ["", "Every seed (same lrs):", "", "| seed | " + " | ".join(
            f"{n} held-out | {n} steps to AdamW's final" for n in summary["rows"] if n != "adamw") +
            " | adamw held-out |", "|---" * (2 * (len(summary["rows"]) - 1) + 2) + "|"]
        for seed, rows in summary["seeds"].items():
            cells = [f"{rows[n]['held_out_loss']:.4f} | {_ratio(rows[n])}" if rows[n]["held_out_loss"] is not None
                     else "diverged | —" for n in rows if n != "adamw"]
            lines.append(f"| {seed} | " + " | ".join(cells) + f" | {rows['adamw']['held_out_loss']:.4f} |")
        means = summary["seed_means"]
        cells = [f"{means[n]['held_out_loss']:.4f} | " + (
            f"{means[n]['step_ratio']:.2f}x; {means[n]['step_ratio_interpolated']:.2f}x interpolated"
            if means[n]["step_ratio"] is not None and means[n]["step_ratio_interpolated"] is not None else "—")
            if means[n]["held_out_loss"] is not None else "— | —" for n in summary["rows"] if n != "adamw"]
        lines.append("| mean | " + " | ".join(cells) + f" | {means['adamw']['held_out_loss']:.4f} |")
    control = results.get("control")
    if control and not control["diverged"]:
        lines += ["", f"Control (not selectable): AdamW with the embeddings and norms at lr "
                  f"{control['optimizer_args']['adam_lr']:g} — the lr Alice and RACS train them with, by Adam — and "
                  f"the linear weights at {control['lr']:g}: training loss {control['select_train_loss']:.4f}, "
                  f"held-out {control['held_out_loss']:.4f}. Steps to reach that held-out loss: " + "; ".join(
                      f"{n} " + ("never" if r["steps"] is None else f"{r['steps']} ({r['step_ratio']:.2f}x" + (
                          f"; {r['step_ratio_interpolated']:.2f}x interpolated)"
                          if r["step_ratio_interpolated"] is not None else ")"))
                      for n, r in control["reach"].items()) + "."]
    lines += ["", "Targets" + (" (the loss and step targets must hold on every seed)" if len(seeds) > 1 else "") +
              ": " + "; ".join(f"{k}: {'met' if v else 'MISSED'}" for k, v in summary["targets"].items()) + ".", "",
              f"Every configuration run (seed {s['sweep_seed']}): the lr grids, then the settings beyond the lr "
              "at the chosen lr (VARIANTS in the script: one change at a time, stated before any ran, then combinations "
              "and lr neighbours of the best, chosen after seeing those). Chosen by the final training loss (mean of the last 10 % "
              "of steps) among those whose state fits the memory target; held-out loss and steps to AdamW's final "
              "for reference only:",
              "", "| optimizer | lr | settings beyond lr | training loss | held-out loss | state vs AdamW | "
              "steps to AdamW's final |", "|---|---|---|---|---|---|---|"]
    for run in results["sweep"]:
        extra = ", ".join(f"{k}={json.dumps(v)}" for k, v in run.get("optimizer_args", {}).items()) or "—"
        mark = " **(chosen)**" if run.get("chosen") else ""
        if run["diverged"]:
            lines.append(f"| {run['optimizer']} | {run['lr']:g} | {extra} | diverged | — | — | — |")
        else:
            lines.append(f"| {run['optimizer']} | {run['lr']:g} | {extra}{mark} | {run['select_train_loss']:.4f} | "
                         f"{run['held_out_loss']:.4f} | {run['state_vs_adamw']:.2f} | {_ratio(run)} |")
    lines += ["", "Optimizer arguments beyond lr: " + "; ".join(
        f"{n}: {json.dumps(r['optimizer_kwargs'])}" for n, r in summary["rows"].items()) + ".",
        "", "![held-out loss per step](img/optim_lm_loss.png)"]
    return "\n".join(lines)


def parse_seeds(text: str) -> list[int]:
    seeds = [int(x) for x in text.split(",") if x.strip()]
    if not seeds or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"expected distinct comma-separated integers, received {text!r}")
    return seeds


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="a smoke run: micro preset, 30 steps, one lr each")
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS,
                        help=f"optimizer steps per run (default: {DEFAULT_STEPS})")
    parser.add_argument("--seeds", type=parse_seeds, default=DEFAULT_SEEDS,
                        help="comma-separated seeds; the lr sweep runs on the first, the others rerun the chosen "
                             f"lrs only (default: {','.join(map(str, DEFAULT_SEEDS))})")
    parser.add_argument("--cache", type=Path, default=None,
                        help="folder of finished runs (JSON): reused when their settings match, so a stopped run "
                             "resumes (default: none)")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    preset = "micro" if args.quick else "tiny"
    model = LMModelConfig(**PRESETS[preset])
    train = LMTrainConfig(steps=30 if args.quick else args.steps, eval_every=10 if args.quick else 25,
                          eval_blocks=16 if args.quick else 64, seed=args.seeds[0])
    names = full_model_optimizers()
    missing = [n for n in names if n not in SWEEP and n not in LM_LR]
    if missing:
        raise ValueError(f"optimizers {missing}: expected an lr grid in SWEEP or an entry in LM_LR, found neither")
    grids = {n: [LM_LR[n]] if args.quick or n not in SWEEP else SWEEP[n] for n in names}
    corpus = load_pydoc_topics(train.held_out)
    started = time.time()

    def run(name: str, lr: float, seed: int, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        result = run_one(name, lr, model, train.replace(seed=seed), corpus, args.cache, extra)
        print(f"[{time.time() - started:6.0f} s] seed {seed} {name} lr={lr:g} {json.dumps(extra or {})}: " +
              (f"train {result['select_train_loss']:.4f}, held-out {result['metrics']['held_out_loss']:.4f}"
               if not result["diverged"] else "diverged"), file=sys.stderr, flush=True)
        return result

    sweep = []
    for name, lrs in grids.items():
        ladder = None if args.quick else LADDER.get(name)
        sweep += sweep_lrs(name, lrs, ladder, lambda lr, name=name: run(name, lr, args.seeds[0]))
    best = {name: choose(sweep, name, grids[name]) for name in names}
    grid_runs = list(sweep)
    for name in ([] if args.quick else names):  # settings beyond the lr, at the lr the sweep chose
        base_lr = best[name]["lr"]
        for extra in VARIANTS.get(name, []):
            sweep.append(run(name, extra.get("lr", base_lr), args.seeds[0], variant_args(extra)))
        best[name] = choose(sweep, name, grids[name])
    control = None if args.quick or "adamw" not in names else run(
        CONTROL["optimizer"], CONTROL["lr"], args.seeds[0], CONTROL["optimizer_args"])
    others = {seed: {name: run(name, best[name]["lr"], seed, best[name].get("optimizer_args"))
                     for name in names} for seed in args.seeds[1:]}
    per_seed = {args.seeds[0]: seed_rows(best, train.steps)}
    per_seed.update({seed: seed_rows(runs, train.steps) for seed, runs in others.items()})
    summary = summarise(best, train.steps, per_seed)
    results = {"settings": {"preset": preset, "parameters": best["adamw"]["metrics"]["parameters"],
                            "seeds": args.seeds, "sweep_seed": args.seeds[0],
                            "steps": train.steps, "batch_size": train.batch_size, "block_size": train.block_size,
                            "warmup": train.warmup, "min_lr_ratio": train.min_lr_ratio, "eval_every": train.eval_every,
                            "eval_blocks": train.eval_blocks, "held_out_bytes": len(corpus.held_out),
                            "sweep": grids, "ladder": None if args.quick else LADDER,
                            "swept": {n: sorted(r["lr"] for r in grid_runs if r["optimizer"] == n) for n in names}},
               "summary": summary,
               "control": control_entry(control, best, train.steps),
               "sweep": [sweep_entry(r, best, sweep, train.steps) for r in sweep],
               "curves": {n: {"lr": r["lr"], "history": r["history"], "train_loss": r["train_loss"]}
                          for n, r in best.items()},
               "seed_curves": {str(seed): {n: {"lr": r["lr"], "history": r["history"]} for n, r in runs.items()
                                           if not r["diverged"]} for seed, runs in others.items()},
               "data": corpus.describe(),
               "train_seconds_total": round(sum(r["metrics"]["train_seconds"] for r in
                                                [*sweep, *(x for runs in others.values() for x in runs.values())]
                                                if not r["diverged"]), 1),
               "environment": environment(torch=torch.__version__, python=platform.python_version())}
    plot(best, best["adamw"]["metrics"]["held_out_loss"], args.out / "img" / "optim_lm_loss.png",
         results["seed_curves"])
    shown = [a for i, a in enumerate(argv) if not (a == "--cache" or a.startswith("--cache=")
                                                   or (i and argv[i - 1] == "--cache"))]
    command = " ".join(["python benchmarks/optim_lm.py", *shown])
    save_results(args.out, SECTION, results, markdown(results, command))
    print(json.dumps({"rows": {n: {k: v for k, v in r.items() if k != "optimizer_kwargs"}
                               for n, r in summary["rows"].items()}, "seed_means": summary["seed_means"],
                      "targets": summary["targets"]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
