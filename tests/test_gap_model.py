"""The scale step's model of the gap against level and size (scorecard/gap_model.py), on made-up gap curves whose
answer is known."""

from __future__ import annotations

import numpy as np
import pytest

from basecap.scorecard.gap_model import gap_model

LEVELS = [round(4.4 - 0.05 * i, 2) for i in range(13)]  # 4.40 down to 3.80


def curves(n: int, gap, noise: float = 0.01, levels=LEVELS) -> dict[int, dict[float, float]]:
    """n seeds, each with its own offset and slope spread evenly around the true curve (so a term that is 0 in truth
    is 0 in the sample means, and one that is not is read against a known spread), and a wiggle along the curve."""
    offsets, tilts = np.linspace(-noise, noise, n), np.linspace(5 * noise, -5 * noise, n)
    return {
        s: {lv: gap(lv) + offsets[s] + tilts[s] * (lv - 4.1) + noise / 4 * float(np.sin(37 * lv + s)) for lv in levels}
        for s in range(n)
    }


def test_a_gap_that_grows_with_size_only():
    g = gap_model(curves(5, lambda lv: 0.10), curves(3, lambda lv: 0.20))
    assert g["terms"] == ["size"] and g["model"] == "gap = a + c [larger size]"
    assert g["size"]["mean"] == pytest.approx(0.10, abs=0.02) and g["overlap"] == [3.8, 4.4] and g["center"] == 4.1


def test_a_gap_that_shrinks_toward_lower_loss_at_both_sizes():
    g = gap_model(curves(5, lambda lv: 0.1 + 0.3 * (lv - 4.1)), curves(4, lambda lv: 0.1 + 0.3 * (lv - 4.1)))
    assert g["terms"] == ["level"] and g["level"]["mean"] == pytest.approx(0.3, abs=0.03)
    assert g["base"]["slope"]["mean"] == pytest.approx(0.3, abs=0.03)


def test_a_slope_that_only_the_larger_size_has():
    g = gap_model(curves(5, lambda lv: 0.1), curves(5, lambda lv: 0.1 + 0.5 * (lv - 4.1)))
    assert "level x size" in g["terms"] and "size" not in g["terms"]


def test_a_constant_gap_and_no_gap():
    assert gap_model(curves(5, lambda lv: 0.1), curves(3, lambda lv: 0.1))["model"] == "gap = a (no level or size term shown)"
    none = gap_model(curves(5, lambda lv: 0.0, noise=0.05), curves(3, lambda lv: 0.0, noise=0.05))
    assert none["terms"] == [] and none["model"].startswith("no gap shown")


def test_the_overlap_is_where_every_seed_of_both_sizes_has_levels():
    small = curves(3, lambda lv: 0.1)
    big = curves(3, lambda lv: 0.1, levels=[round(4.1 - 0.05 * i, 2) for i in range(17)])  # 4.10 down to 3.30
    g = gap_model(small, big)
    assert g["overlap"] == [3.8, 4.1] and g["center"] == 3.95
    assert gap_model(small, curves(3, lambda lv: 0.1, levels=[3.5, 3.45, 3.4])) is None  # no common level
    assert gap_model(small, {0: big[0]}) is None and gap_model(None, big) is None  # one seed: no interval
