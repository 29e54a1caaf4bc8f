"""Where something ran: the processor and its vector extensions beside the architecture and CPU count.

PyTorch's and ONNX Runtime's CPU kernels pick code paths by vector width (SSE/AVX2/AVX-512, FMA, NEON), so a
float result, a benchmark ratio or a hash of a trained model is only comparable between machines that agree on
these. `veil env` prints it; every benchmark records it (``benchmarks/common.py``'s ``environment``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from importlib import metadata
from pathlib import Path

# the extensions that change which float kernels run, in the order they are listed
VECTOR_EXTENSIONS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
                     "avx512_bf16", "amx_tile", "neon", "asimd", "sve", "sve2")
PACKAGES = ("numpy", "torch", "onnxruntime", "onnx", "tenseal", "scikit-learn")
# environment variables that choose a BLAS / OpenMP code path or thread count
KNOBS = ("OPENBLAS_CORETYPE", "MKL_ENABLE_INSTRUCTIONS", "ATEN_CPU_CAPABILITY", "OMP_NUM_THREADS")


def _cpuinfo(path: Path = Path("/proc/cpuinfo")) -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (empty where the file does not exist)."""
    fields: dict[str, str] = {}
    try:
        text = path.read_text()
    except OSError:
        return fields
    for line in text.split("\n\n", 1)[0].splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    return fields


def processor(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict[str, object]:
    """{"model": name, "vector_extensions": [...]} of this machine's processor."""
    info = _cpuinfo(cpuinfo)
    model = info.get("model name") or info.get("Model") or info.get("CPU part") or platform.processor() or "unknown"
    flags = set((info.get("flags") or info.get("Features") or "").split())
    return {"model": model, "vector_extensions": [f for f in VECTOR_EXTENSIONS if f in flags]}


def describe(threads: str = "") -> str:
    """One line: "x86_64, 2 CPUs (AMD EPYC: avx, avx2, fma)" (``threads`` appended, e.g. "1 thread")."""
    cpu = processor()
    extensions = ", ".join(cpu["vector_extensions"]) or "no listed vector extensions"  # type: ignore[arg-type]
    line = f"{platform.machine()}, {os.cpu_count()} CPUs ({cpu['model']}: {extensions})"
    return line + (f", {threads}" if threads else "")


def package_versions() -> dict[str, str | None]:
    """Installed versions of veil and the packages whose kernels a result depends on (None: not installed)."""
    versions: dict[str, str | None] = {}
    for name in ("veil", *PACKAGES):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def report() -> dict[str, object]:
    """Everything `veil env` prints: versions, machine, processor, the code-path knobs that are set."""
    return {"python": platform.python_version(), "platform": platform.platform(), "machine": platform.machine(),
            "cpus": os.cpu_count(), "processor": processor(), "packages": package_versions(),
            "environment": {k: os.environ[k] for k in KNOBS if k in os.environ}}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="veil env", description="Print where veil runs: versions, processor model, its vector extensions.",
        epilog="example:\n  veil env\n  veil env --json > machine.json",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.json:
        print(json.dumps(report(), indent=1))
        return 0
    versions = package_versions()
    print(f"veil {versions['veil']} on Python {platform.python_version()}, {platform.platform()}")
    print(f"machine: {describe()}")
    print("packages: " + ", ".join(f"{k} {v}" for k, v in versions.items() if v and k != "veil"))
    for key in KNOBS:
        if key in os.environ:
            print(f"{key}={os.environ[key]}")
    return 0
