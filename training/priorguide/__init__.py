"""PriorGuide training side: simulators with known answers and the amortized diffusion posterior."""

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

__all__ = ["TASKS", "SamplerTrainConfig", "ScoreEstimator", "ScoreNet", "ScoreNetConfig", "Task", "TrainResult",
           "get_task", "load_posterior", "load_sampler", "save_sampler", "simulator_task", "train_score"]
