"""Issue 24: one error hierarchy for the engine (engine/errors.py), mapped to a protocol status in one function."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from veil.engine import errors
from veil.he.errors import ExpiredKey, UnknownKey

ENGINE = Path(__file__).resolve().parents[2] / "engine"
# not request failures: a config-file syntax error (repository loading turns it into ModelLoadFailed) and the
# port-busy error of `veil serve` at start-up
NOT_REQUEST_ERRORS = {"engine/pbtxt.py": {"PbtxtError", "PbtxtSchemaError"}, "engine/server.py": {"ServeError"}}


def test_every_engine_error_class_lives_in_errors_py() -> None:
    found = {}
    for path in sorted(ENGINE.rglob("*.py")):
        if path.name == "errors.py" and path.parent == ENGINE:
            continue
        rel = str(path.relative_to(ENGINE.parent))
        names = {node.name for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ClassDef)
                 and any(isinstance(b, (ast.Name, ast.Attribute)) and (getattr(b, "id", None) or b.attr).endswith(
                     ("Error", "Exception", "Failed", "Found", "Mismatch", "Request", "Input")) for b in node.bases)}
        names -= NOT_REQUEST_ERRORS.get(rel, set())
        if names:
            found[rel] = sorted(names)
    assert found == {}


@pytest.mark.parametrize(("exc", "status"), [
    (errors.InvalidCodecInput("bad stream"), 400), (errors.InvalidSamplerRequest("bad prior"), 400),
    (errors.ModelNotFound("m"), 404), (errors.PayloadTooLarge("big"), 413), (errors.QueueFull("full"), 503),
    (UnknownKey("key"), UnknownKey.status_code), (ExpiredKey("old"), ExpiredKey.status_code),
    (RuntimeError("a bug"), 500), (KeyError("x"), 500),
])
def test_http_status_is_the_one_mapping(exc: BaseException, status: int) -> None:
    assert errors.http_status(exc) == status


def test_codec_and_sampler_refusals_are_inference_failures() -> None:
    """Both moved from their model modules; callers that caught InferenceFailed (a 400) still do."""
    from veil.engine.codec_model import InvalidCodecInput
    from veil.engine.sampler_model import InvalidSamplerRequest

    assert InvalidCodecInput is errors.InvalidCodecInput and InvalidSamplerRequest is errors.InvalidSamplerRequest
    assert issubclass(InvalidCodecInput, errors.InferenceFailed) and issubclass(InvalidSamplerRequest, errors.InferenceFailed)
