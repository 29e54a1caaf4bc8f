"""veil.config: typed dataclass configs, JSON round trip, argparse generation."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Literal

import pytest

from veil.config import Config, ConfigError, field


@dataclass
class Inner(Config):
    """An inner config."""

    rate: float = field(0.5, "a rate")


@dataclass
class Outer(Config):
    """An outer config."""

    mode: Literal["a", "b"] = field("a", "the mode")
    count: int = field(3, "how many")
    sizes: list[int] = field([1, 2], "sizes")
    flag: bool = field(False, "a switch")
    name: str | None = field(None, "optional name")
    inner: Inner = field(None, "nested")  # type: ignore[arg-type]

    def __post_init__(self) -> None:
        self.inner = Inner() if self.inner is None else self.inner
        super().__post_init__()


def test_json_round_trip_is_identity() -> None:
    cfg = Outer(mode="b", count=7, sizes=[4], flag=True, name="x", inner=Inner(rate=0.25))
    again = Outer.from_json(cfg.to_json())
    assert again == cfg
    assert json.loads(cfg.to_json())["inner"] == {"rate": 0.25}


def test_bad_literal_names_field_expected_and_received() -> None:
    with pytest.raises(ConfigError, match=r"Outer\.mode: expected one of \['a', 'b'\], received 'c'"):
        Outer(mode="c")  # type: ignore[arg-type]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"count": "3"}, r"Outer\.count: expected an int, received '3'"),
    ({"count": True}, r"Outer\.count: expected an int"),
    ({"flag": 1}, r"Outer\.flag: expected a bool"),
    ({"sizes": [1, "x"]}, r"Outer\.sizes\[1\]: expected an int"),
])
def test_wrong_types_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Outer(**kwargs)


def test_int_is_accepted_for_float_and_converted() -> None:
    assert Inner(rate=1).rate == 1.0 and isinstance(Inner(rate=1).rate, float)


def test_unknown_keys_warn_and_are_ignored() -> None:
    with pytest.warns(UserWarning, match=r"unknown keys \['typo'\]"):
        cfg = Outer.from_dict({"count": 2, "typo": 1})
    assert cfg.count == 2


def test_argparse_flags_generated_from_metadata() -> None:
    parser = argparse.ArgumentParser()
    Outer.add_arguments(parser)
    Inner.add_arguments(parser, prefix="inner-")
    args = parser.parse_args(["--mode", "b", "--count", "5", "--flag", "--sizes", "7", "8", "--inner-rate", "0.1"])
    inner = Inner.from_args(args, prefix="inner-")
    cfg = Outer.from_args(args, base={"count": 9, "name": "kept"}, inner=inner)
    assert (cfg.mode, cfg.count, cfg.flag, cfg.sizes, cfg.name, cfg.inner.rate) == ("b", 5, True, [7, 8], "kept", 0.1)
    assert "the mode (default: a)" in parser.format_help()
    with pytest.raises(SystemExit):
        parser.parse_args(["--mode", "z"])


def test_help_shows_each_default_once_and_no_empty_one() -> None:
    """Issue 32: `veil serve --help` printed `(default: )` for empty defaults and a second default after a help text
    that already stated one (--he-key-dir)."""
    from veil.engine.cli import build_parser

    text = " ".join(build_parser().format_help().split())
    assert "(default: )" not in text
    assert "(default: <repo>/.he-keys) (default:" not in text and "(default: <repo>/.he-keys)" in text
    assert "TCP port (default: 8000)" in text


def test_a_field_named_by_the_prefix_is_not_prefixed_twice() -> None:
    @dataclass
    class Method(Config):
        method_scale: float = field(1.0, "named like PEFT's psoft_mag_a")
        depth: int = field(2, "an ordinary field")

    parser = argparse.ArgumentParser()
    Method.add_arguments(parser, prefix="method-")
    cfg = Method.from_args(parser.parse_args(["--method-scale", "0.3", "--method-depth", "4"]), prefix="method-")
    assert (cfg.method_scale, cfg.depth) == (0.3, 4)
    with pytest.raises(SystemExit):
        parser.parse_args(["--method-method-scale", "0.3"])


def test_a_dict_field_takes_an_inline_json_object(capsys: pytest.CaptureFixture[str]) -> None:
    @dataclass
    class WithDict(Config):
        extra: dict[str, int] = field({}, "keyword arguments")

    parser = argparse.ArgumentParser()
    WithDict.add_arguments(parser)
    assert WithDict.from_args(parser.parse_args(["--extra", '{"k": 2}'])).extra == {"k": 2}
    with pytest.raises(SystemExit):
        parser.parse_args(["--extra", "[1, 2]"])
    assert "expected a JSON object, received '[1, 2]'" in capsys.readouterr().err
