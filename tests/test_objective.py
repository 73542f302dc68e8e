"""Objectives (mean, quantiles, CVaR) and the discrete CVaR they rest on."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetpar.costmodel.objective import Objective, cvar, quantile
from hetpar.errors import ConfigError


@pytest.mark.parametrize("text, kind, level", [
    ("mean", "mean", 0.0),
    ("MEAN", "mean", 0.0),
    (" mean ", "mean", 0.0),
    ("p50", "quantile", 0.5),
    ("p90", "quantile", 0.9),
    ("p99", "quantile", 0.99),
    ("p99.9", "quantile", 0.999),
    ("cvar0.9", "cvar", 0.9),
    ("cvar.95", "cvar", 0.95),
    ("cvar90", "cvar", 0.9),
    ("cvar99", "cvar", 0.99),
    ("CVaR0.5", "cvar", 0.5),
])
def test_parse(text, kind, level):
    obj = Objective.parse(text)
    assert obj.kind == kind
    assert obj.level == pytest.approx(level, abs=1e-12)


@pytest.mark.parametrize("text", ["mean", "p50", "p90", "cvar0.9", "cvar0.95"])
def test_name_round_trips(text):
    obj = Objective.parse(text)
    assert Objective.parse(obj.name) == obj


def test_cvar_spellings_agree():
    assert Objective.parse("cvar90") == Objective.parse("cvar0.9")


@pytest.mark.parametrize("text", ["", "median", "p", "p100", "p-5", "cvar", "cvar1.5",
                                  "cvar100", "cvar 0.9", "q90", "mean2", "p90x", "cvar0.9.1",
                                  "90"])
def test_bad_strings_rejected(text):
    with pytest.raises(ConfigError) as info:
        Objective.parse(text)
    assert info.value.field == "objective"
    assert repr(text) in str(info.value)


def test_objective_values():
    x = np.arange(1.0, 11.0)  # 1..10
    assert Objective.parse("mean")(x) == pytest.approx(5.5)
    assert Objective.parse("p50")(x) == pytest.approx(5.5)
    assert Objective.parse("p90")(x) == pytest.approx(np.quantile(x, 0.9))
    # Worst 10% of ten samples is the largest one.
    assert Objective.parse("cvar0.9")(x) == pytest.approx(10.0)
    # Worst 20%: the two largest.
    assert Objective.parse("cvar80")(x) == pytest.approx(9.5)
    assert quantile(x, 0.0) == 1.0 and quantile(x, 1.0) == 10.0


def test_cvar_splits_the_straddling_sample():
    x = np.array([1.0, 2.0, 3.0, 4.0])
    # alpha 0.6: tail weight 1.6 samples = all of 4 and 0.6 of 3.
    assert cvar(x, 0.6) == pytest.approx((4.0 + 0.6 * 3.0) / 1.6)
    # Order of the samples does not matter.
    assert cvar(x[::-1], 0.6) == pytest.approx(cvar(x, 0.6))


samples = st.lists(st.floats(min_value=-1e6, max_value=1e6, allow_nan=False,
                             allow_infinity=False), min_size=1, max_size=60).map(np.array)


@settings(max_examples=200, deadline=None)
@given(samples)
def test_cvar_at_zero_is_the_mean(x):
    assert cvar(x, 0.0) == pytest.approx(float(np.mean(x)), rel=1e-9, abs=1e-6)


@settings(max_examples=200, deadline=None)
@given(samples, st.floats(min_value=1.0 - 1e-9, max_value=1.0, exclude_max=True))
def test_cvar_near_one_is_the_max(x, alpha):
    assert cvar(x, alpha) == pytest.approx(float(np.max(x)), rel=1e-9, abs=1e-6)


@settings(max_examples=300, deadline=None)
@given(samples, st.floats(min_value=0.0, max_value=1.0, exclude_max=True),
       st.floats(min_value=0.0, max_value=1.0, exclude_max=True))
def test_cvar_is_monotone_in_alpha(x, a, b):
    lo, hi = sorted((a, b))
    tol = 1e-9 * max(1.0, float(np.max(np.abs(x))))
    assert cvar(x, lo) <= cvar(x, hi) + tol
    # And it lies between the mean and the maximum.
    assert float(np.mean(x)) - tol <= cvar(x, lo) <= float(np.max(x)) + tol


@settings(max_examples=200, deadline=None)
@given(samples, st.floats(min_value=0.0, max_value=0.999))
def test_cvar_is_at_least_the_quantile(x, alpha):
    tol = 1e-9 * max(1.0, float(np.max(np.abs(x))))
    assert cvar(x, alpha) >= quantile(x, alpha) - tol


@settings(max_examples=200, deadline=None)
@given(samples, st.floats(min_value=0.0, max_value=0.99),
       st.floats(min_value=0.1, max_value=100.0), st.floats(min_value=-100.0, max_value=100.0))
def test_cvar_is_translation_and_scale_equivariant(x, alpha, scale, shift):
    tol = 1e-7 * (1.0 + abs(shift) + scale * float(np.max(np.abs(x))))
    assert cvar(scale * x + shift, alpha) == pytest.approx(scale * cvar(x, alpha) + shift,
                                                           abs=tol)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(min_value=0.0, max_value=1e3), min_size=1, max_size=20),
       st.integers(min_value=1, max_value=5), st.floats(min_value=0.0, max_value=0.99))
def test_cvar_ignores_replication(values, copies, alpha):
    # Repeating every sample k times is the same distribution.
    x = np.array(values)
    assert cvar(np.repeat(x, copies), alpha) == pytest.approx(cvar(x, alpha), rel=1e-9, abs=1e-9)
