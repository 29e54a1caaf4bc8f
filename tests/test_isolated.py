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
