"""A small parser for the protobuf text format that Triton's ``config.pbtxt`` files are written in.

It knows no schema: it returns nested dicts in which a field seen once maps to its value and a field seen
several times (``input { } input { }``) or written as a list (``input [ {..}, {..} ]``) maps to a list.
:mod:`veil.engine.repository` gives the values their meaning. Supported syntax: ``name: value``, nested
messages with or without the colon (``dynamic_batching { }``, ``version_policy: { latest { } }``), ``{ }`` or
``< >`` delimiters, lists ``[ 1, 8, 8 ]``, double- or single-quoted strings with escapes, integers (incl.
hex), floats, enum identifiers, ``true``/``false``, comments from ``#`` to the end of the line and optional
``,``/``;`` separators.

Example:
    >>> parse('max_batch_size: 8  input [ { name: "x" dims: [ -1, 4 ] } ]  # comment')
    {'max_batch_size': 8, 'input': [{'name': 'x', 'dims': [-1, 4]}]}
    >>> parse_model_config('max_batch_sise: 8')
    Traceback (most recent call last):
    veil.engine.pbtxt.PbtxtSchemaError: max_batch_sise: unknown field of ModelConfig (did you mean 'max_batch_size'?)

:func:`parse_model_config` adds the schema: Triton's ``model_config.proto`` (``inference.ModelConfig``, the
message ``tritonclient`` ships as ``model_config_pb2``) transcribed below, so a misspelt field, a value of the
wrong type, a non-repeated field given twice or two members of a ``oneof`` are refused as Triton refuses them,
without making the engine depend on protobuf or tritonclient (a test checks the transcription against the proto).
"""

from __future__ import annotations

import difflib
import re
from typing import Any

_TOKEN = re.compile(r"""
    (?P<space>\s+|\#[^\n]*)
  | (?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
  | (?P<number>[-+]?(?:0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)[fF]?
                |-?(?:inf|infinity|nan)\b)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_.]*)
  | (?P<punct>[{}\[\]<>:,;])
""", re.VERBOSE | re.IGNORECASE)
_CLOSE = {"{": "}", "<": ">"}
_MAX_DEPTH = 64  # nested messages/lists; deeper text is refused rather than exhausting the stack
_ESCAPE = re.compile(r"\\(?:([0-7]{1,3})|x([0-9a-fA-F]{1,2})|u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8})|(.))", re.DOTALL)
_SIMPLE_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "f": "\f", "v": "\v", "\\": "\\",
                   "'": "'", '"': '"', "?": "?"}


class PbtxtError(ValueError):
    """The text is not valid protobuf text format; the message gives line and column."""


def _tokenize(text: str) -> list[tuple[str, str, int]]:
    """Split into (kind, text, offset) tokens, dropping spaces and comments."""
    tokens, pos = [], 0
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:
            raise PbtxtError(f"{_where(text, pos)}: unexpected character {text[pos]!r}")
        if match.lastgroup != "space":
            tokens.append((match.lastgroup or "", match.group(), pos))
        pos = match.end()
    return tokens


def _where(text: str, pos: int) -> str:
    line = text.count("\n", 0, pos) + 1
    return f"line {line}, column {pos - (text.rfind(chr(10), 0, pos) + 1) + 1}"


class _Parser:
    def __init__(self, text: str) -> None:
        self.text, self.tokens, self.i, self.depth = text, _tokenize(text), 0, 0

    def peek(self) -> tuple[str, str, int] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def error(self, message: str) -> PbtxtError:
        tok = self.peek()
        where = _where(self.text, tok[2]) if tok else "end of text"
        return PbtxtError(f"{where}: {message}, found {tok[1]!r}" if tok else f"{where}: {message}")

    def take(self, value: str | None = None, kind: str | None = None) -> str:
        tok = self.peek()
        if tok is None or (value is not None and tok[1] != value) or (kind is not None and tok[0] != kind):
            raise self.error(f"expected {value or kind}")
        self.i += 1
        return tok[1]

    def accept(self, value: str) -> bool:
        tok = self.peek()
        if tok is not None and tok[0] == "punct" and tok[1] == value:
            self.i += 1
            return True
        return False

    def message(self, close: str | None) -> dict[str, Any]:
        """Fields up to ``close`` (or the end of text when None)."""
        self.depth += 1
        if self.depth > _MAX_DEPTH:
            raise self.error(f"expected at most {_MAX_DEPTH} nested levels")
        out: dict[str, Any] = {}
        while True:
            tok = self.peek()
            if tok is None:
                if close is not None:
                    raise self.error(f"missing {close!r}")
                return out
            if tok[0] == "punct" and tok[1] == close:
                self.i += 1
                self.depth -= 1
                return out
            name = self.take(kind="ident")
            colon = self.accept(":")
            value, is_list = self.field_value(colon)
            if name in out:
                previous = out[name] if isinstance(out[name], list) else [out[name]]
                out[name] = previous + (value if is_list else [value])
            else:
                out[name] = value
            self.accept(",") or self.accept(";")

    def field_value(self, colon: bool) -> tuple[Any, bool]:
        tok = self.peek()
        if tok is not None and tok[0] == "punct" and tok[1] in _CLOSE:
            self.i += 1
            return self.message(_CLOSE[tok[1]]), False
        if tok is not None and tok[0] == "punct" and tok[1] == "[":
            self.i += 1
            items: list[Any] = []
            while not self.accept("]"):
                items.append(self.field_value(True)[0])
                if not self.accept(","):
                    self.take("]")
                    break
            return items, True
        if not colon:
            raise self.error("expected ':' or '{' after a field name")
        return self.scalar(), False

    def scalar(self) -> Any:
        tok = self.peek()
        if tok is None or tok[0] not in ("string", "number", "ident"):
            raise self.error("expected a value")
        self.i += 1
        kind, text = tok[0], tok[1]
        if kind == "string":
            parts = [text]
            while (nxt := self.peek()) is not None and nxt[0] == "string":  # "a" "b" concatenates
                parts.append(nxt[1])
                self.i += 1
            return "".join(_unquote(p, self.text, tok[2]) for p in parts)
        if kind == "number":
            return _number(text)
        return {"true": True, "false": False, "True": True, "False": False}.get(text, text)


def _unquote(literal: str, text: str, pos: int) -> str:
    """A quoted string's value with protobuf text escapes (\\n, \\', \\ooo octal, \\xHH, \\uXXXX...)."""
    def one(match: re.Match[str]) -> str:
        octal, hex2, u4, u8, simple = match.groups()
        if simple is not None:
            if simple not in _SIMPLE_ESCAPES:
                raise PbtxtError(f"{_where(text, pos)}: unknown escape \\{simple} in a string")
            return _SIMPLE_ESCAPES[simple]
        code = int(octal, 8) if octal else int(hex2 or u4 or u8, 16)
        if code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
            raise PbtxtError(f"{_where(text, pos)}: escape {match.group()} is not a Unicode code point")
        return chr(code)

    return _ESCAPE.sub(one, literal[1:-1])


def _number(text: str) -> int | float:
    lowered = text.lower()
    if "x" in lowered:
        return int(lowered, 16)
    if lowered.lstrip("+-") in ("inf", "infinity", "nan"):
        return float(lowered.replace("infinity", "inf"))
    lowered = lowered.rstrip("f")  # C-style float suffix: 1.5f
    return float(lowered) if any(c in lowered for c in ".e") else int(lowered)


def parse(text: str) -> dict[str, Any]:
    """Parse protobuf text format into nested dicts (repeated fields become lists).

    Raises:
        PbtxtError: on a syntax error, with the line and column.
    """
    return _Parser(text).message(None)


# -- the schema: inference.ModelConfig from Triton's model_config.proto ----------------------------------------
# "Message = field:type ..." (``*`` marks a repeated field; continuation lines are indented) and
# "Enum = enum NAME ...". Map fields are repeated ``{ key value }`` entries, as protobuf text format writes them.
_SCHEMA_TEXT = """
ModelConfig = name:string platform:string backend:string runtime:string version_policy:ModelVersionPolicy
    max_batch_size:int32 input:*ModelInput output:*ModelOutput batch_input:*BatchInput
    batch_output:*BatchOutput optimization:ModelOptimizationPolicy dynamic_batching:ModelDynamicBatching
    sequence_batching:ModelSequenceBatching ensemble_scheduling:ModelEnsembling
    instance_group:*ModelInstanceGroup default_model_filename:string
    cc_model_filenames:*ModelConfig.CcModelFilenamesEntry metric_tags:*ModelConfig.MetricTagsEntry
    parameters:*ModelConfig.ParametersEntry model_warmup:*ModelWarmup model_operations:ModelOperations
    model_transaction_policy:ModelTransactionPolicy model_repository_agents:ModelRepositoryAgents
    response_cache:ModelResponseCache model_metrics:ModelMetrics
ModelVersionPolicy = latest:ModelVersionPolicy.Latest all:ModelVersionPolicy.All
    specific:ModelVersionPolicy.Specific
ModelVersionPolicy.Latest = num_versions:uint32
ModelVersionPolicy.All =
ModelVersionPolicy.Specific = versions:*int64
ModelInput = name:string data_type:DataType format:ModelInput.Format dims:*int64 reshape:ModelTensorReshape
    is_shape_tensor:bool allow_ragged_batch:bool optional:bool is_non_linear_format_io:bool
ModelTensorReshape = shape:*int64
ModelOutput = name:string data_type:DataType dims:*int64 reshape:ModelTensorReshape label_filename:string
    is_shape_tensor:bool is_non_linear_format_io:bool
BatchInput = kind:BatchInput.Kind target_name:*string data_type:DataType source_input:*string
BatchOutput = target_name:*string kind:BatchOutput.Kind source_input:*string
ModelOptimizationPolicy = graph:ModelOptimizationPolicy.Graph priority:ModelOptimizationPolicy.ModelPriority
    cuda:ModelOptimizationPolicy.Cuda execution_accelerators:ModelOptimizationPolicy.ExecutionAccelerators
    input_pinned_memory:ModelOptimizationPolicy.PinnedMemoryBuffer
    output_pinned_memory:ModelOptimizationPolicy.PinnedMemoryBuffer gather_kernel_buffer_threshold:uint32
    eager_batching:bool
ModelOptimizationPolicy.Graph = level:int32
ModelOptimizationPolicy.Cuda = graphs:bool busy_wait_events:bool
    graph_spec:*ModelOptimizationPolicy.Cuda.GraphSpec output_copy_stream:bool
ModelOptimizationPolicy.Cuda.GraphSpec = batch_size:int32
    input:*ModelOptimizationPolicy.Cuda.GraphSpec.InputEntry
    graph_lower_bound:ModelOptimizationPolicy.Cuda.GraphSpec.LowerBound
ModelOptimizationPolicy.Cuda.GraphSpec.InputEntry = key:string
    value:ModelOptimizationPolicy.Cuda.GraphSpec.Shape
ModelOptimizationPolicy.Cuda.GraphSpec.Shape = dim:*int64
ModelOptimizationPolicy.Cuda.GraphSpec.LowerBound = batch_size:int32
    input:*ModelOptimizationPolicy.Cuda.GraphSpec.LowerBound.InputEntry
ModelOptimizationPolicy.Cuda.GraphSpec.LowerBound.InputEntry = key:string
    value:ModelOptimizationPolicy.Cuda.GraphSpec.Shape
ModelOptimizationPolicy.ExecutionAccelerators =
    gpu_execution_accelerator:*ModelOptimizationPolicy.ExecutionAccelerators.Accelerator
    cpu_execution_accelerator:*ModelOptimizationPolicy.ExecutionAccelerators.Accelerator
ModelOptimizationPolicy.ExecutionAccelerators.Accelerator = name:string
    parameters:*ModelOptimizationPolicy.ExecutionAccelerators.Accelerator.ParametersEntry
ModelOptimizationPolicy.ExecutionAccelerators.Accelerator.ParametersEntry = key:string value:string
ModelOptimizationPolicy.PinnedMemoryBuffer = enable:bool
ModelDynamicBatching = preferred_batch_size:*int32 max_queue_delay_microseconds:uint64
    preserve_ordering:bool priority_levels:uint64 default_priority_level:uint64
    default_queue_policy:ModelQueuePolicy
    priority_queue_policy:*ModelDynamicBatching.PriorityQueuePolicyEntry
ModelQueuePolicy = timeout_action:ModelQueuePolicy.TimeoutAction default_timeout_microseconds:uint64
    allow_timeout_override:bool max_queue_size:uint32
ModelDynamicBatching.PriorityQueuePolicyEntry = key:uint64 value:ModelQueuePolicy
ModelSequenceBatching = direct:ModelSequenceBatching.StrategyDirect
    oldest:ModelSequenceBatching.StrategyOldest max_sequence_idle_microseconds:uint64
    control_input:*ModelSequenceBatching.ControlInput state:*ModelSequenceBatching.State
    iterative_sequence:bool
ModelSequenceBatching.StrategyDirect = max_queue_delay_microseconds:uint64 minimum_slot_utilization:float
ModelSequenceBatching.StrategyOldest = max_candidate_sequences:int32 preferred_batch_size:*int32
    max_queue_delay_microseconds:uint64 preserve_ordering:bool
ModelSequenceBatching.ControlInput = name:string control:*ModelSequenceBatching.Control
ModelSequenceBatching.Control = kind:ModelSequenceBatching.Control.Kind int32_false_true:*int32
    fp32_false_true:*float bool_false_true:*bool data_type:DataType
ModelSequenceBatching.State = input_name:string output_name:string data_type:DataType dims:*int64
    initial_state:*ModelSequenceBatching.InitialState use_same_buffer_for_input_output:bool
    use_growable_memory:bool
ModelSequenceBatching.InitialState = data_type:DataType dims:*int64 zero_data:bool data_file:string
    name:string
ModelEnsembling = step:*ModelEnsembling.Step max_inflight_requests:uint32
ModelEnsembling.Step = model_name:string model_version:int64 input_map:*ModelEnsembling.Step.InputMapEntry
    output_map:*ModelEnsembling.Step.OutputMapEntry model_namespace:string
ModelEnsembling.Step.InputMapEntry = key:string value:string
ModelEnsembling.Step.OutputMapEntry = key:string value:string
ModelInstanceGroup = name:string kind:ModelInstanceGroup.Kind count:int32 rate_limiter:ModelRateLimiter
    gpus:*int32 secondary_devices:*ModelInstanceGroup.SecondaryDevice profile:*string passive:bool
    host_policy:string
ModelRateLimiter = resources:*ModelRateLimiter.Resource priority:uint32
ModelRateLimiter.Resource = name:string global:bool count:uint32
ModelInstanceGroup.SecondaryDevice = kind:ModelInstanceGroup.SecondaryDevice.SecondaryDeviceKind
    device_id:int64
ModelConfig.CcModelFilenamesEntry = key:string value:string
ModelConfig.MetricTagsEntry = key:string value:string
ModelConfig.ParametersEntry = key:string value:ModelParameter
ModelParameter = string_value:string
ModelWarmup = name:string batch_size:uint32 inputs:*ModelWarmup.InputsEntry count:uint32
ModelWarmup.InputsEntry = key:string value:ModelWarmup.Input
ModelWarmup.Input = data_type:DataType dims:*int64 zero_data:bool random_data:bool input_data_file:string
ModelOperations = op_library_filename:*string
ModelTransactionPolicy = decoupled:bool
ModelRepositoryAgents = agents:*ModelRepositoryAgents.Agent
ModelRepositoryAgents.Agent = name:string parameters:*ModelRepositoryAgents.Agent.ParametersEntry
ModelRepositoryAgents.Agent.ParametersEntry = key:string value:string
ModelResponseCache = enable:bool
ModelMetrics = metric_control:*ModelMetrics.MetricControl
ModelMetrics.MetricControl = metric_identifier:ModelMetrics.MetricControl.MetricIdentifier
    histogram_options:ModelMetrics.MetricControl.HistogramOptions
ModelMetrics.MetricControl.MetricIdentifier = family:string
ModelMetrics.MetricControl.HistogramOptions = buckets:*double
DataType = enum TYPE_INVALID TYPE_BOOL TYPE_UINT8 TYPE_UINT16 TYPE_UINT32 TYPE_UINT64 TYPE_INT8 TYPE_INT16
    TYPE_INT32 TYPE_INT64 TYPE_FP16 TYPE_FP32 TYPE_FP64 TYPE_STRING TYPE_BF16
ModelInput.Format = enum FORMAT_NONE FORMAT_NHWC FORMAT_NCHW
BatchInput.Kind = enum BATCH_ELEMENT_COUNT BATCH_ACCUMULATED_ELEMENT_COUNT
    BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO BATCH_MAX_ELEMENT_COUNT_AS_SHAPE BATCH_ITEM_SHAPE
    BATCH_ITEM_SHAPE_FLATTEN
BatchOutput.Kind = enum BATCH_SCATTER_WITH_INPUT_SHAPE
ModelOptimizationPolicy.ModelPriority = enum PRIORITY_DEFAULT PRIORITY_MAX PRIORITY_MIN
ModelQueuePolicy.TimeoutAction = enum REJECT DELAY
ModelSequenceBatching.Control.Kind = enum CONTROL_SEQUENCE_START CONTROL_SEQUENCE_READY CONTROL_SEQUENCE_END
    CONTROL_SEQUENCE_CORRID
ModelInstanceGroup.Kind = enum KIND_AUTO KIND_GPU KIND_CPU KIND_MODEL
ModelInstanceGroup.SecondaryDevice.SecondaryDeviceKind = enum KIND_NVDLA
"""
# oneof groups: at most one member may be set
ONEOFS: dict[str, list[tuple[str, ...]]] = {
    "ModelConfig": [("dynamic_batching", "sequence_batching", "ensemble_scheduling")],
    "ModelVersionPolicy": [("latest", "all", "specific")],
    "ModelSequenceBatching": [("direct", "oldest")],
    "ModelSequenceBatching.InitialState": [("zero_data", "data_file")],
    "ModelWarmup.Input": [("zero_data", "random_data", "input_data_file")],
}
_INT_RANGES = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1), "uint32": (0, 2**32 - 1),
               "uint64": (0, 2**64 - 1)}
_SCALARS = {"string", "bool", "float", "double", *_INT_RANGES}


def _read_schema(text: str) -> tuple[dict[str, dict[str, str]], dict[str, tuple[str, ...]]]:
    messages: dict[str, dict[str, str]] = {}
    enums: dict[str, tuple[str, ...]] = {}
    for block in re.split(r"\n(?=\S)", text.strip()):
        name, _, body = block.partition(" =")
        words = body.split()
        if words[:1] == ["enum"]:
            enums[name] = tuple(words[1:])
        else:
            messages[name] = dict(w.split(":") for w in words)
    return messages, enums


MESSAGES, ENUMS = _read_schema(_SCHEMA_TEXT)


class PbtxtSchemaError(PbtxtError):
    """The text parses but does not fit Triton's model configuration schema; the message names the field."""


def parse_model_config(text: str) -> dict[str, Any]:
    """Parse ``config.pbtxt`` text and check it against Triton's ``ModelConfig`` schema.

    Returns the fields as nested dicts in which every repeated field is a list (also when written once).

    Raises:
        PbtxtError: a syntax error (line and column); PbtxtSchemaError: an unknown field, a wrong type, a
            non-repeated field given twice or two members of a oneof (the message names the field path).
    """
    return _check_message(parse(text), "ModelConfig", "")


def _check_message(value: Any, message: str, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise PbtxtSchemaError(f"{path.rstrip('.') or message}: expected a message {{ ... }} ({message}), "
                               f"received {value!r}")
    fields, out = MESSAGES[message], {}
    for key, item in value.items():
        where = path + key
        if key not in fields:
            close = difflib.get_close_matches(key, fields, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else f"; expected one of {sorted(fields)}"
            raise PbtxtSchemaError(f"{where}: unknown field of {message}{hint}")
        kind = fields[key]
        if kind.startswith("*"):
            items = item if isinstance(item, list) else [item]
            out[key] = [_check_value(x, kind[1:], f"{where}[{i}]") for i, x in enumerate(items)]
        elif isinstance(item, list):
            raise PbtxtSchemaError(f"{where}: expected one value (the field is not repeated), received {item!r}")
        else:
            out[key] = _check_value(item, kind, where)
    for group in ONEOFS.get(message, []):
        present = [k for k in group if k in out]
        if len(present) > 1:
            raise PbtxtSchemaError(f"{path}{present[1]}: expected at most one of {list(group)} (a oneof), "
                                   f"received {present}")
    return out


def _check_value(value: Any, kind: str, where: str) -> Any:
    if kind in MESSAGES:
        return _check_message(value, kind, where + ".")
    if kind in ENUMS:
        if not isinstance(value, str) or value not in ENUMS[kind]:
            raise PbtxtSchemaError(f"{where}: expected one of {list(ENUMS[kind])}, received {value!r}")
        return value
    if kind == "string":
        if not isinstance(value, str):
            raise PbtxtSchemaError(f"{where}: expected a string, received {value!r}")
        return value
    if kind == "bool":
        if value in (0, 1) and not isinstance(value, float):  # true/false, or 1/0 as protobuf text allows
            return bool(value)
        raise PbtxtSchemaError(f"{where}: expected true or false, received {value!r}")
    if kind in ("float", "double"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise PbtxtSchemaError(f"{where}: expected a number, received {value!r}")
        return float(value)
    low, high = _INT_RANGES[kind]
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise PbtxtSchemaError(f"{where}: expected an integer in [{low}, {high}] ({kind}), received {value!r}")
    return value
