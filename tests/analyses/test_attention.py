"""The shared attention helpers: head names, previous-token masses, windows."""

from types import SimpleNamespace

import numpy as np
import pytest

from posmech.analyses.attention import (
    check_head,
    head_name,
    mean_prev_token_mass,
    parse_head,
    prev_token_mass,
    window,
    window_block,
)
from posmech.core.errors import PosmechError


def test_head_names_round_trip_and_errors_name_the_key():
    assert head_name(4, 11) == "L4H11"
    assert head_name(np.int64(0), np.int32(3)) == "L0H3"
    assert parse_head("L4H11") == (4, 11)
    assert parse_head(head_name(12, 0)) == (12, 0)
    for bad in ("4.11", "L4", "l4h11", "L4H11 ", "H11L4"):
        with pytest.raises(PosmechError, match="taxonomy.pin.sharp"):
            parse_head(bad, "taxonomy.pin.sharp")


def test_check_head_refuses_heads_outside_the_model():
    bridge = SimpleNamespace(cfg=SimpleNamespace(n_layers=2, n_heads=4))
    assert check_head(bridge, "L1H3") == (1, 3)
    for name in ("L2H0", "L0H4"):
        with pytest.raises(PosmechError, match=f"head {name} does not exist in a model with 2 layers × 4 heads"):
            check_head(bridge, name)


def test_previous_token_masses_on_a_known_pattern():
    # row q: 0.7 on key q-1, the rest on key 0 (row 0 all on itself)
    T = 6
    p = np.zeros((T, T))
    p[0, 0] = 1.0
    for q in range(1, T):
        p[q, q - 1] += 0.7
        p[q, 0] += 0.3
    mass = prev_token_mass(p)
    assert mass.shape == (T - 1,)
    # query 1's previous key is key 0, which also gets the 0.3
    np.testing.assert_allclose(mass, [1.0, 0.7, 0.7, 0.7, 0.7])
    mass[:] = 0  # a copy, not a view of the pattern
    assert p[1, 0] == 1.0
    assert mean_prev_token_mass(p) == pytest.approx(np.mean([1.0, 0.7, 0.7, 0.7, 0.7]))
    # rows select queries; query 0 never counts
    assert mean_prev_token_mass(p, slice(0, 2)) == pytest.approx(1.0)
    assert mean_prev_token_mass(p, slice(2, 6)) == pytest.approx(0.7)
    assert np.isnan(mean_prev_token_mass(p, slice(0, 1)))


def test_mean_mass_is_the_mean_of_the_per_query_masses_bitwise():
    rng = np.random.default_rng(0)
    p = rng.random((37, 37))
    for rows in (None, slice(5, 20), slice(0, 37, 3)):
        q = np.arange(37)[rows] if rows is not None else np.arange(37)
        q = q[q >= 1]
        assert mean_prev_token_mass(p, rows) == float(p[q, q - 1].mean())


def test_window_is_fitted_into_the_document_and_block_cut_on_the_diagonal():
    assert window(1024, 100, 50) == (100, 50)
    assert window(32, 100, 50) == (0, 32)
    assert window(60, 30, 50) == (10, 50)
    p = np.arange(100.0).reshape(10, 10)
    b = window_block(p, 2, 3)
    np.testing.assert_array_equal(b, [[22, 23, 24], [32, 33, 34], [42, 43, 44]])
    b[0, 0] = -1
    assert p[2, 2] == 22  # a copy
    assert window_block(p, 8, 5).shape == (2, 2)  # shorter at the end of the document
