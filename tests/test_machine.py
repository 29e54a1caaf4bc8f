"""veil.machine: the processor model and vector extensions a result was measured on (`veil env`)."""

from __future__ import annotations

import json
import platform

from veil.machine import describe, main, processor

X86 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse sse2 sse4_1 sse4_2 avx fma avx2 avx512f avx512bw

processor\t: 1
model name\t: some other core
flags\t\t: fpu
"""
ARM = """processor\t: 0
BogoMIPS\t: 50.00
Features\t: fp asimd evtstrm aes sve
CPU part\t: 0xd0c
"""


def test_the_first_processor_s_model_and_extensions_are_read(tmp_path) -> None:
    (tmp_path / "x86").write_text(X86)
    (tmp_path / "arm").write_text(ARM)
    assert processor(tmp_path / "x86") == {"model": "AMD EPYC 7B13",
                                           "vector_extensions": ["sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw"]}
    assert processor(tmp_path / "arm") == {"model": "0xd0c", "vector_extensions": ["asimd", "sve"]}
    assert processor(tmp_path / "absent")["vector_extensions"] == []  # no /proc (macOS): no guess


def test_describe_names_architecture_cpus_processor_and_threads() -> None:
    line = describe("1 thread")
    assert line.startswith(f"{platform.machine()}, ") and " CPUs (" in line and line.endswith(", 1 thread")


def test_veil_env_prints_text_and_json(capsys) -> None:
    assert main([]) == 0
    assert "machine: " in capsys.readouterr().out
    assert main(["--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {"processor", "packages", "cpus"} <= set(report) and "numpy" in report["packages"]
