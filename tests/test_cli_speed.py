"""Issue 24: every `veil ... --help` and every usage error answers without importing the heavy stack.

Building a verb's parser must not import torch, transformers, onnx or onnxruntime (import them inside the command
that runs): that is what made `veil train uldnet --help` take 1.9 s on a quiet machine and 6-21 s on a busy one.
Checked as a property (which modules got imported), not as a timing.
"""

from __future__ import annotations

import json
import subprocess
import sys

from veil.cli import GROUPS

HEAVY = ("torch", "transformers", "onnx", "onnxruntime", "fastapi")
# every verb, including new ones (finetune, train rl, serve and recommend imported torch or onnxruntime until their
# settings moved beside, not inside, the code that trains or serves)
VERBS = [f"{group} {verb}".strip() for group, (_, verbs, _) in GROUPS.items() for verb in verbs] + ["demo"]
FLAGS = {"--help": 0, "--not-a-flag": 2}  # the flag and the exit status it must give


def test_every_help_and_usage_error_imports_no_heavy_package() -> None:
    """``veil VERB --help`` and ``veil VERB --not-a-flag`` for every verb, in one fresh interpreter; after each
    call, the heavy packages newly in sys.modules are charged to it."""
    code = f"""
import contextlib, io, json, sys
import veil.cli
heavy, out = {HEAVY!r}, {{}}
for flag in {list(FLAGS)!r}:
    for verb in {VERBS!r}:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            status = veil.cli.main([*verb.split(), flag])
        out[verb + " " + flag] = [status, sorted(m for m in heavy if m in sys.modules)]
print(json.dumps(out))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert len(result) == len(VERBS) * len(FLAGS)
    assert {"train uldnet", "export onnx", "compress", "finetune", "train rl", "serve", "recommend"} <= set(VERBS)
    assert {call: status for call, (status, _) in result.items() if status != FLAGS[call.rsplit(" ", 1)[1]]} == {}
    assert {call: mods for call, (_, mods) in result.items() if mods} == {}


def test_he_help_prints_its_examples_once(capsys) -> None:
    """`veil he --help` printed the docstring's examples and then EXAMPLE (issue 24)."""
    from veil.cli import main

    assert main(["he", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.count("veil he keygen  --server") == 1 and "example:" in out


def test_the_parser_side_task_names_are_the_simulators() -> None:
    """`veil train sampler --task` choices come from the torch-free config; they must be the simulator tasks."""
    from veil.training.priorguide.config import TASK_NAMES
    from veil.training.priorguide.simulators import TASKS

    assert sorted(TASK_NAMES) == sorted(TASKS)
