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
"""

from __future__ import annotations

import ast
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
        self.text, self.tokens, self.i = text, _tokenize(text), 0

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
        out: dict[str, Any] = {}
        while True:
            tok = self.peek()
            if tok is None:
                if close is not None:
                    raise self.error(f"missing {close!r}")
                return out
            if tok[0] == "punct" and tok[1] == close:
                self.i += 1
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
            return "".join(ast.literal_eval(p) for p in parts)
        if kind == "number":
            return _number(text)
        return {"true": True, "false": False, "True": True, "False": False}.get(text, text)


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
