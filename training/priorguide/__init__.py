"""PriorGuide training side: simulators with known answers and the amortized diffusion posterior."""

from __future__ import annotations

from typing import TYPE_CHECKING

from veil.lazy import lazy_exports

if TYPE_CHECKING:
    from .model import ScoreNet, ScoreNetConfig
    from .simulators import TASKS, Task, get_task, simulator_task
    from .trainer import (
        SamplerTrainConfig,
        ScoreEstimator,
        TrainResult,
        load_posterior,
        load_sampler,
        save_sampler,
        train_score,
    )

# public name -> the submodule that defines it, imported on first use (a CLI's --help never imports torch)
__getattr__, __dir__ = lazy_exports(__name__, {
    "ScoreNet": ".model",
    "ScoreNetConfig": ".config",
    "TASKS": ".simulators",
    "Task": ".simulators",
    "get_task": ".simulators",
    "simulator_task": ".simulators",
    "SamplerTrainConfig": ".config",
    "ScoreEstimator": ".trainer",
    "TrainResult": ".trainer",
    "load_posterior": ".trainer",
    "load_sampler": ".trainer",
    "save_sampler": ".trainer",
    "train_score": ".trainer",
})

__all__ = ["TASKS", "SamplerTrainConfig", "ScoreEstimator", "ScoreNet", "ScoreNetConfig", "Task", "TrainResult",
           "get_task", "load_posterior", "load_sampler", "save_sampler", "simulator_task", "train_score"]
