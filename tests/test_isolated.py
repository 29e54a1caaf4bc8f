"""The `isolated` marker (tests/conftest.py): the body runs in a forked child that shares the parent's fixtures,
reports pass / skip / failure back, and takes what it allocated with it."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

_TOUCHED: list[int] = []  # what the isolated test below appends must not reach the parent


@pytest.mark.isolated
def test_an_isolated_body_runs_in_a_child_with_the_parents_fixtures(tmp_path) -> None:
    _TOUCHED.append(os.getpid())
    (tmp_path / "child").write_text(str(os.getpid()))
    assert tmp_path.is_dir()


def test_what_an_isolated_test_did_stays_in_its_child() -> None:
    assert _TOUCHED == []


def _item(body):
    return SimpleNamespace(funcargs={"x": 2, "unused": 0}, _fixtureinfo=SimpleNamespace(argnames=("x",)), obj=body)


def test_outcomes_come_back_from_the_child(run_forked) -> None:
    assert run_forked(_item(lambda x: None)) == ("passed", "")
    kind, text = run_forked(_item(lambda x: x / 0))
    assert kind == "failed" and "ZeroDivisionError" in text and "x / 0" in text
    assert run_forked(_item(lambda x: pytest.skip(f"no {x}"))) == ("skipped", "no 2")
    kind, text = run_forked(_item(lambda x: os._exit(3)))  # a child that dies (OOM kill, native abort)
    assert kind == "failed" and "died without reporting" in text


class _Finalized:
    """Garbage in a reference cycle whose finalizer records the process that ran it."""

    def __init__(self, path) -> None:
        self.path, self.cycle = path, self

    def __del__(self) -> None:
        with open(self.path, "a") as log:
            log.write(f"{os.getpid()}\n")


def test_the_child_never_finalizes_what_it_inherited(run_forked, tmp_path) -> None:
    # what earlier tests left behind (a stopped gRPC aio server's objects) is not collected in the child: a finalizer
    # there joined a thread the child does not have, and a 10 s test timed out at 900 s in CI
    import gc

    log = tmp_path / "finalized"
    gc.disable()  # the cycle stays uncollected in the parent until the fork
    try:
        _Finalized(log)
        assert run_forked(_item(lambda x: gc.collect())) == ("passed", "")
    finally:
        gc.enable()
    gc.collect()  # the parent finalizes it, once
    assert log.read_text().split() == [str(os.getpid())]
