"""One-example safety realignment ("Safety at One Shot: Patching Fine-Tuned LLMs with A Single Instance", Zhang et
al., ICLR 2026, arXiv 2601.01887; spec §3) and the safety gate, reproduced on a tiny byte-level Llama.

Public names: the synthetic data, the refusal judge and gate, the one-example patch and its selection, the
align -> attack -> patch pipeline, and the ``realign`` recipe stage (``STAGES``). docs/compress_safety.md.
"""

from veil.training.compress.registry import Stage, register_stages

from .data import REFUSAL, UNIVERSAL_EXAMPLE, SafetyData
from .judge import GateSet, attack_success_rate, generate, is_refusal, safety_gate
from .mechanism import safety_gradient_report
from .patch import patch, select_bilevel, select_gradient
from .pipeline import PipelineConfig, run_pipeline
from .stage import RealignConfig, apply_realign

STAGES: dict[str, Stage] = {"realign": Stage("realign", RealignConfig, apply_realign)}
register_stages(STAGES)

__all__ = ["REFUSAL", "STAGES", "UNIVERSAL_EXAMPLE", "GateSet", "PipelineConfig", "RealignConfig", "SafetyData",
           "apply_realign", "attack_success_rate", "generate", "is_refusal", "patch", "run_pipeline", "safety_gate",
           "safety_gradient_report", "select_bilevel", "select_gradient"]
