"""Progress that fits a log: a tqdm bar on a terminal, plain lines anywhere else (issue 33.3).

Every long step in veil reports through :func:`progress` (a loop or a count) or :func:`stage` (one step without
iterations: an HE compile, a key upload). On a terminal (the stream's ``isatty()``) it is a tqdm bar; in a log,
a pipe or CI it writes one plain line when the stage ends (and one every ``VEIL_PROGRESS_SECONDS``, default 30,
while a long stage runs: a loop at its next iteration, a :func:`stage` from a heartbeat thread), never a ``\\r``.
``TQDM_DISABLE=1`` (tqdm's own variable) silences both, as does the caller's ``enabled=False`` (``--no-progress``).

Example:
    >>> from veil.progress import progress
    >>> for step in progress(range(3), desc="train", enabled=False):
    ...     pass
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import IO, Any

_UNSET = ("", "0", "false", "no", "off")  # any other value of TQDM_DISABLE disables, as in tqdm


def progress_enabled(enabled: bool = True) -> bool:
    """Whether progress is shown at all: the caller's flag and ``TQDM_DISABLE`` unset (or 0/false/no/off)."""
    return enabled and os.environ.get("TQDM_DISABLE", "").strip().lower() in _UNSET


_MIN_HEARTBEAT = 0.01  # seconds; VEIL_PROGRESS_SECONDS=0 (a loop's line at every step) must not spin a stage's thread


def progress_seconds() -> float:
    """``VEIL_PROGRESS_SECONDS`` (default 30): how often a running stage repeats its line in a log.

    Raises:
        ValueError: the variable is not a finite number of seconds >= 0 (its name, the expected and the received value).
    """
    raw = os.environ.get("VEIL_PROGRESS_SECONDS", "30")
    try:
        seconds = float(raw)
    except ValueError:
        seconds = float("nan")
    if not 0 <= seconds < float("inf"):
        raise ValueError(f"VEIL_PROGRESS_SECONDS: expected a number of seconds >= 0, got {raw!r}")
    return seconds


def _is_terminal(stream: IO[str]) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # a closed or stream-like object without isatty
        return False


class LineProgress:
    """The tqdm subset veil uses (iterate, ``update``, ``set_postfix``, ``close``, a context manager), as log lines."""

    def __init__(self, iterable: Iterable | None = None, *, total: int | None = None, desc: str = "",
                 file: IO[str] | None = None, enabled: bool = True, every: float | None = None) -> None:
        self.iterable, self.desc, self.file, self.enabled = iterable, desc, file, enabled
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)  # type: ignore[arg-type]
        self.total, self.n, self.postfix, self.closed = total, 0, "", False
        self.every = progress_seconds() if every is None else every
        self.start = self.last = time.perf_counter()

    def __iter__(self) -> Iterator:
        try:
            for item in self.iterable or ():
                yield item
                self.update(1)
        finally:
            self.close()

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __len__(self) -> int:
        return self.total or 0

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.perf_counter()
        if self.enabled and now - self.last >= self.every:
            self.last = now
            self._line("")

    def set_postfix(self, ordered_dict: dict | None = None, refresh: bool = True, **kwargs: Any) -> None:
        items = {**(ordered_dict or {}), **kwargs}
        self.postfix = ", ".join(f"{k}={v}" for k, v in items.items())

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        self.postfix = s

    def set_description(self, desc: str | None = None, refresh: bool = True) -> None:
        self.desc = desc or ""

    def refresh(self) -> None:
        """tqdm's redraw; a log line is written only at the interval and at the end."""

    def write(self, s: str) -> None:
        print(s, file=self.file or sys.stderr, flush=True)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.enabled:
                self._line("done ")

    def _line(self, state: str) -> None:
        count = f"{self.n}/{self.total}" if self.total else f"{self.n}"
        tail = f", {self.postfix}" if self.postfix else ""
        print(f"{self.desc}: {state}{count} in {time.perf_counter() - self.start:.1f} s{tail}",
              file=self.file or sys.stderr, flush=True)


def progress(iterable: Iterable | None = None, *, total: int | None = None, desc: str = "", enabled: bool = True,
             leave: bool = True, file: IO[str] | None = None) -> Any:
    """A tqdm bar on a terminal, a :class:`LineProgress` elsewhere; silent without ``enabled`` or with TQDM_DISABLE.

    Args:
        iterable: what to loop over (or None and call ``update``).
        total: the count when ``iterable`` has no length.
        desc: the stage's name, the start of every line.
        enabled: the caller's switch (``--no-progress`` passes False).
        leave: keep the bar on the terminal once done (a log always gets the final line).
        file: the stream, stderr by default (results go to stdout).
    """
    stream = file or sys.stderr
    if progress_enabled(enabled) and _is_terminal(stream):
        from tqdm import tqdm

        return tqdm(iterable, total=total, desc=desc, leave=leave, file=stream, disable=False)
    return LineProgress(iterable, total=total, desc=desc, file=file, enabled=progress_enabled(enabled))


@contextmanager
def stage(desc: str, *, enabled: bool = True, file: IO[str] | None = None) -> Iterator[dict[str, Any]]:
    """One line when a step without iterations ends: ``desc: done in 12.3 s[, what the step put in the dict]``.

    While the step runs, a daemon thread writes ``desc: running, 30.0 s so far`` every ``VEIL_PROGRESS_SECONDS``
    (default 30), so a minutes-long HE compile is not silent in a log. The thread ends with the step, also when
    the step raises (then there is no "done" line). Disabled progress writes nothing and starts no thread.

    Example:
        >>> with stage("compile", enabled=False) as info:
        ...     info["ops"] = 12
    """
    info: dict[str, Any] = {}
    start = time.perf_counter()
    if not progress_enabled(enabled):
        yield info
        return
    stream = file or sys.stderr
    every, stop = max(progress_seconds(), _MIN_HEARTBEAT), threading.Event()

    def heartbeat() -> None:
        while not stop.wait(every):
            print(f"{desc}: running, {time.perf_counter() - start:.1f} s so far", file=stream, flush=True)

    beat = threading.Thread(target=heartbeat, name=f"veil-progress {desc}", daemon=True)
    beat.start()
    try:
        yield info
    finally:
        stop.set()
        beat.join()  # before the "done" line, so a heartbeat never lands after it
    tail = "".join(f", {k}={v}" for k, v in info.items())
    print(f"{desc}: done in {time.perf_counter() - start:.1f} s{tail}", file=stream, flush=True)


def quiet_library_bars(stream: IO[str] | None = None) -> bool:
    """Silence the tqdm bars of Hugging Face libraries ("Loading weights", "Writing model shards") where veil's own
    progress would be plain lines: stderr not a terminal, or TQDM_DISABLE set. They write ``\\r`` updates into a log
    (issue 33: `veil export onnx bundled:all-MiniLM-L6-v2` and every `veil finetune` text run did). Sets
    ``HF_HUB_DISABLE_PROGRESS_BARS=1`` (huggingface_hub, and transformers which reads it when imported) unless the
    user set it, and turns transformers' bars off if it is already imported. Returns whether it silenced them.
    """
    if progress_enabled() and _is_terminal(stream or sys.stderr):
        return False
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if "transformers" in sys.modules and os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] not in _UNSET:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    return True
