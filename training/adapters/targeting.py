"""Which modules of a model an adapter config targets, with PEFT's matching rules.

``huggingface/peft:src/peft/tuners/tuners_utils.py`` (``check_target_module_exists``,
``_maybe_include_all_linear_layers``): a list entry matches a name exactly or as a ``.entry`` suffix, a string
is a full-match regex, ``"all-linear"`` is every ``nn.Linear`` (and GPT-2 ``Conv1D``) but the output head, ``exclude_modules`` wins, and
modules inside ``modules_to_save`` are never targeted.
"""

from __future__ import annotations

import re

from torch import nn

from .config import ALL_LINEAR, AdapterConfig
from .layer import LINEAR_TYPES

SEQ_CLS_HEAD_NAMES = ("score", "classifier")  # PEFT's constant: heads all-linear leaves out for SEQ_CLS
# The heads PEFT adds to ``modules_to_save`` by itself for these task types (``PeftModelForSequenceClassification``,
# ``...ForTokenClassification``): every candidate name, whether the model has it or not. PEFT 0.22 added DistilBERT's
# ``pre_classifier`` (its ``CLASSIFIER_MODULE_NAMES``); before that the list was ``classifier``, ``score``.
PEFT_TASK_HEAD_NAMES = ("classifier", "score", "pre_classifier")
PEFT_HEAD_TASK_TYPES = ("SEQ_CLS", "TOKEN_CLS")


def _matches(spec: list[str] | str, name: str) -> bool:
    if isinstance(spec, str):
        return re.fullmatch(spec, name) is not None
    return name in spec or any(name.endswith(f".{entry}") for entry in spec)


def in_modules_to_save(config: AdapterConfig, name: str) -> bool:
    """True when ``name`` is one of ``modules_to_save`` or lies inside one."""
    return any(re.match(rf"(^|.*\.){m}($|\..*)", name) for m in config.modules_to_save or ())


def _output_heads(model: nn.Module, config: AdapterConfig) -> set[str]:
    """Names of the output head(s) ``all-linear`` leaves out, as PEFT guesses them."""
    heads: set[nn.Module] = set()
    get_out = getattr(model, "get_output_embeddings", None)
    out = get_out() if callable(get_out) else None
    if out is not None:
        heads.add(out)
    elif config.task_type == "SEQ_CLS":
        heads.update(getattr(model, n) for n in SEQ_CLS_HEAD_NAMES if isinstance(getattr(model, n, None), nn.Module))
    return {name for name, module in model.named_modules() if module in heads}


def find_targets(model: nn.Module, config: AdapterConfig, supported: tuple[type[nn.Module], ...] = LINEAR_TYPES
                 ) -> list[str]:
    """Names of the modules ``config`` targets in ``model`` (in ``named_modules`` order).

    Raises:
        ValueError: nothing matched, or a matched module is of a type the method cannot wrap.
    """
    if config.target_modules == ALL_LINEAR:
        skip = _output_heads(model, config)
        spec: list[str] | str = [n for n, m in model.named_modules() if isinstance(m, LINEAR_TYPES) and n not in skip]
    else:
        spec = config.target_modules  # type: ignore[assignment]
    names = []
    for name, module in model.named_modules():
        if not name or not _matches(spec, name):
            continue
        if config.exclude_modules and _matches(config.exclude_modules, name):
            continue
        if in_modules_to_save(config, name):
            continue
        exact = isinstance(config.target_modules, list) and name in config.target_modules
        if not exact and not config.in_selected_layer(name):  # PEFT: an exact name ignores layers_to_transform
            continue
        if not isinstance(module, supported):
            raise ValueError(f"target_modules: {name!r} is a {type(module).__name__}; expected one of "
                             f"{[t.__name__ for t in supported]} (narrow target_modules or use exclude_modules)")
        names.append(name)
    if not names:
        raise ValueError(f"target_modules: expected names of {[t.__name__ for t in supported]} modules in the model, "
                         f"received {config.target_modules!r} which matches none")
    return names
