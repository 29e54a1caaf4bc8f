"""`veil he` against a server that is down: one line naming what it tried and what to check (issue 33.4)."""

from __future__ import annotations

import socket

import pytest

from veil.cli import main


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_keygen_against_a_down_server_is_one_line_and_nonzero(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{_free_port()}"
    status = main(["he", "keygen", "--server", url, "--model", "digits-he", "--keyring", str(tmp_path / "k")])
    err = capsys.readouterr().err
    assert status != 0 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert f"{url}/v2/models/digits-he" in err  # what it tried
    assert "veil serve" in err and "--server" in err  # what to check
