"""Per-module compression log: one line per compressed module to stderr, and the records kept for the report.

Every stage calls ``log(module, seconds, error, params_before, params_after, **extra)`` once per module it
changes (a factorised Linear, a pruned expert block, a realigned weight). ``error`` is the stage's own
objective or reconstruction error (None where a stage has none); ``extra`` holds method-specific numbers
(rank, beta, ...), which must be JSON-serialisable.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO


class ModuleLog:
    """Callable module logger; ``records`` is the list of dicts the report tabulates.

    ``stage`` is set by the recipe runner before each stage so every record names the stage it came from.
    """

    def __init__(self, progress: bool = True, stream: TextIO | None = None) -> None:
        self.progress = progress
        self.stream = stream
        self.stage: str | None = None
        self.records: list[dict[str, Any]] = []

    def __call__(self, module: str, seconds: float, error: float | None, params_before: int, params_after: int,
                 **extra: Any) -> None:
        record = {"stage": self.stage, "module": module, "seconds": float(seconds),
                  "error": None if error is None else float(error),
                  "params_before": int(params_before), "params_after": int(params_after), **extra}
        self.records.append(record)
        if self.progress:
            print(self.format(record), file=self.stream or sys.stderr, flush=True)

    @staticmethod
    def format(record: dict[str, Any]) -> str:
        """One human line: stage, module, time, error, size before -> after, extras."""
        err = "-" if record["error"] is None else f"{record['error']:.4g}"
        before, after = record["params_before"], record["params_after"]
        keep = after / before if before else 1.0
        core = {"stage", "module", "seconds", "error", "params_before", "params_after"}
        extra = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                         for k, v in record.items() if k not in core)
        return (f"[{record['stage'] or '-'}] {record['module']}: {record['seconds']:.2f}s error={err} "
                f"params {before}->{after} (keep {keep:.3f}){' ' + extra if extra else ''}")

    def totals(self) -> dict[str, Any]:
        """Summed time and parameters of the logged modules."""
        before = sum(r["params_before"] for r in self.records)
        after = sum(r["params_after"] for r in self.records)
        return {"modules": len(self.records), "seconds": sum(r["seconds"] for r in self.records),
                "params_before": before, "params_after": after}
