"""veil: a privacy- and deployment-oriented inference engine.

The front door: the version and the CLI. The rooms are imported by name, lazily, so that importing
``veil`` (or ``veil.he`` on a client) never pulls in torch:

    from veil.training.uldnet import ModelConfig, TrainConfig, train_uldnet, multiplicative_depth
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
