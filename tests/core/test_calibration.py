"""The per-model correction factor: reported / estimated, averaged, clamped."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.calibration import MAX_FACTOR, MIN_FACTOR, WINDOW, apply_factor, update_factor


def test_the_first_sample_sets_the_factor() -> None:
    assert update_factor(1.0, 0, 1000, 1200) == (pytest.approx(1.2), 1)


def test_a_steady_ratio_is_learned_exactly() -> None:
    factor, samples = 1.0, 0
    for _ in range(50):
        factor, samples = update_factor(factor, samples, 10_000, 11_500)
    assert factor == pytest.approx(1.15)
    assert samples == WINDOW


def test_the_first_samples_are_a_plain_mean() -> None:
    factor, samples = 1.0, 0
    for reported in (1100, 1300, 1200):
        factor, samples = update_factor(factor, samples, 1000, reported)
    assert (factor, samples) == (pytest.approx(1.2), 3)


def test_one_outlier_moves_a_settled_factor_by_at_most_a_window_share() -> None:
    factor, samples = 1.1, WINDOW
    moved, _ = update_factor(factor, samples, 1000, 1_000_000)
    assert moved == pytest.approx(1.1 + (MAX_FACTOR - 1.1) / WINDOW)


@pytest.mark.parametrize(("estimated", "reported"), [(0, 100), (100, 0), (-5, 100), (100, -1)])
def test_junk_samples_change_nothing(estimated: int, reported: int) -> None:
    assert update_factor(1.3, 7, estimated, reported) == (1.3, 7)


@pytest.mark.parametrize("factor", [math.nan, math.inf, -1.0, 0.0])
def test_a_corrupt_stored_factor_starts_over(factor: float) -> None:
    assert update_factor(factor, 12, 1000, 1500) == (pytest.approx(1.5), 1)
    assert apply_factor(1000, factor) == 1000


def test_apply_factor_rounds_up_and_clamps() -> None:
    assert apply_factor(1000, 1.1) == 1100
    assert apply_factor(1000, 1.0001) == 1001
    assert apply_factor(1000, 10.0) == 1000 * MAX_FACTOR
    assert apply_factor(1000, 0.01) == 1000 * MIN_FACTOR
    assert apply_factor(0, 1.5) == 0
    assert apply_factor(-3, 1.5) == 0


@settings(max_examples=300, deadline=None)
@given(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-5, 100),
    st.lists(st.tuples(st.integers(-10, 10**7), st.integers(-10, 10**7)), min_size=1, max_size=30),
)
def test_the_factor_and_count_always_stay_in_range(
    factor: float, samples: int, observations: list[tuple[int, int]]
) -> None:
    for estimated, reported in observations:
        factor, samples = update_factor(factor, samples, estimated, reported)
        assert MIN_FACTOR <= factor <= MAX_FACTOR
        assert 0 <= samples <= WINDOW
        assert MIN_FACTOR * 1000 <= apply_factor(1000, factor) <= MAX_FACTOR * 1000


@settings(max_examples=300, deadline=None)
@given(
    st.floats(MIN_FACTOR, MAX_FACTOR),
    st.integers(0, WINDOW),
    st.integers(1, 10**7),
    st.integers(1, 10**7),
)
def test_an_update_moves_toward_the_clamped_sample(
    factor: float, samples: int, estimated: int, reported: int
) -> None:
    new, count = update_factor(factor, samples, estimated, reported)
    ratio = min(MAX_FACTOR, max(MIN_FACTOR, reported / estimated))
    assert min(factor, ratio) - 1e-12 <= new <= max(factor, ratio) + 1e-12
    assert count == min(samples + 1, WINDOW)
