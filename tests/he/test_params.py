"""CKKS parameter validation (128-bit only), selection from a level budget, and the size report."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from veil.he import HEError, ParameterError, SecretKeyring, SecurityError
from veil.he.params import MAX_LOG_Q_128, CkksParameters, describe, select_parameters


def test_valid_set_properties_and_round_trip() -> None:
    p = CkksParameters(8192, (60, 40, 40, 60), 40)
    assert (p.levels, p.log_q, p.slots, p.scale, p.integer_bits) == (2, 200, 4096, 2.0**40, 20)
    assert CkksParameters.from_dict(p.to_dict()) == p
    assert p.hash() == CkksParameters(8192, [60, 40, 40, 60], 40).hash()  # lists are normalized to tuples
    assert p.hash() != CkksParameters(8192, (60, 40, 60), 40).hash()
    assert p.seal_context() is p.seal_context()
    assert p.seal_context().parameters_set()


@pytest.mark.parametrize("n", [8192, 16384])
def test_log_q_above_the_128_bit_cap_is_refused(n: int) -> None:
    cap = MAX_LOG_Q_128[n]
    levels = (cap - 120) // 40 + 1  # one level more than fits under the cap
    with pytest.raises(SecurityError, match=rf"log2 Q <= {cap} .* received {120 + 40 * levels}"):
        CkksParameters(n, (60, *[40] * levels, 60), 40)


def test_largest_sets_at_the_cap_are_accepted() -> None:
    assert CkksParameters(8192, (31, *[26] * 6, 31), 26).log_q == 218  # TenSEAL Tutorial 4
    assert CkksParameters(16384, (60, *[40] * 7, 60), 40).levels == 7


@pytest.mark.parametrize(("args", "field"), [
    ((2048, (27, 27), 27), "poly_modulus_degree"),
    ((8192, (60, 40, 30, 60), 40), "middle primes equal to scale_bits=40"),
    ((8192, (30, 40, 40, 60), 40), r"coeff_mod_bit_sizes\[0\]"),
    ((8192, (60, 40, 40, 50), 40), r"coeff_mod_bit_sizes\[-1\]"),
    ((8192, (61, 40, 61), 40), "every prime in 20..60"),
    ((8192, (60, 19, 60), 19), "scale_bits"),
    ((8192, (60,), 40), "at least 2 ints"),
    ((8192.0, (60, 40, 60), 40), "poly_modulus_degree: expected an int"),
])
def test_ill_formed_sets_are_refused_naming_the_field(args: tuple, field: str) -> None:
    with pytest.raises(ParameterError, match=field):
        CkksParameters(*args)


def test_from_dict_refuses_missing_and_unknown_keys() -> None:
    with pytest.raises(ParameterError, match="expected keys"):
        CkksParameters.from_dict({"poly_modulus_degree": 8192, "scale_bits": 40})
    with pytest.raises(ParameterError, match="expected keys"):
        CkksParameters.from_dict({"poly_modulus_degree": 8192, "coeff_mod_bit_sizes": [60, 40, 60],
                                  "scale_bits": 40, "security": "none"})


def test_errors_are_value_errors_with_status_code() -> None:
    assert issubclass(SecurityError, HEError) and issubclass(HEError, ValueError)
    assert SecurityError.status_code == 400


@pytest.mark.parametrize(("levels", "n"), [(0, 4096), (2, 8192), (4, 16384), (7, 16384), (10, 32768)])
def test_select_parameters_picks_the_smallest_feasible_n(levels: int, n: int) -> None:
    p = select_parameters(levels, precision_bits=20)
    assert (p.poly_modulus_degree, p.levels) == (n, levels)
    assert p.precision_bits >= 20 and p.integer_bits >= 10
    assert p.log_q <= MAX_LOG_Q_128[n]


def test_select_parameters_respects_min_slots_and_precision() -> None:
    assert select_parameters(2, min_slots=8000).poly_modulus_degree == 16384
    low, high = select_parameters(2, precision_bits=16), select_parameters(2, precision_bits=30)
    assert low.scale_bits < high.scale_bits


def test_select_parameters_refuses_infeasible_depth_with_a_clear_message() -> None:
    with pytest.raises(ParameterError, match=r"needs 33 levels.*N=32768, log2 Q <= 881\) gives at most \d+ ") as err:
        select_parameters(33)
    most = int(re.search(r"at most (\d+)", str(err.value)).group(1))
    assert select_parameters(most).levels == most  # the message is exact, not a guess
    with pytest.raises(ParameterError):
        select_parameters(most + 1)
    with pytest.raises(ParameterError, match="levels"):
        select_parameters(-1)


def test_describe_reports_security_and_sizes_that_match_real_keys() -> None:
    p = CkksParameters(8192, (60, 40, 40, 60), 40)
    d = describe(p, [1, 2, -1, 4095])  # -1 and 4095 are the same rotation
    assert d["security"] == "128-bit (HE standard)" and d["levels"] == 2 and d["slots"] == 4096
    sizes = d["sizes_bytes"]
    assert sizes["galois_keys"] == 3 * sizes["galois_key_per_step"]
    assert sizes["ciphertext_fresh"] < 0.6 * sizes["ciphertext_fresh_unseeded"]  # seeded: about half
    ring = SecretKeyring.generate(p, [1, 2, -1])
    keys = ring.evaluation_keys()
    assert keys.size_bytes == pytest.approx(sizes["relin_keys"] + sizes["galois_keys"], rel=0.03)
    assert len(ring.encrypt_to_bytes([[1.0]])) == pytest.approx(sizes["ciphertext_fresh"], rel=0.03)


def test_import_veil_he_does_not_import_torch() -> None:
    code = "import sys, veil.he; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
