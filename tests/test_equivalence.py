"""Known answers for the equivalence tests and power calculations of basecap.report.equivalence (scipy, textbook
values, the figure of the scorecard's issue, and simulation)."""

import math

import numpy as np
import pytest
from scipy import stats

from basecap.report import equivalence as eq

X = [0.012, -0.020, 0.031, 0.004, -0.008, 0.015]


def test_one_sided_p_is_scipys_one_sample_t_test():
    for bound in (-0.05, 0.0, 0.05):
        for alt in ("greater", "less"):
            assert eq.one_sided_p(X, bound, alt) == pytest.approx(stats.ttest_1samp(X, bound, alternative=alt).pvalue, rel=1e-12)


def test_tost_is_the_larger_of_two_one_sided_tests_and_matches_the_interval():
    r = eq.tost(X, 0.05)
    lo = stats.ttest_1samp(X, -0.05, alternative="greater").pvalue
    hi = stats.ttest_1samp(X, 0.05, alternative="less").pvalue
    assert r["p"] == pytest.approx(max(lo, hi)) and r["p_lower"] == pytest.approx(lo) and r["p_upper"] == pytest.approx(hi)
    # TOST at level a  <=>  the (1 - 2a) interval inside the margin
    n, m, s = len(X), np.mean(X), np.std(X, ddof=1)
    for a in (0.01, 0.05, 0.1):
        half = stats.t.ppf(1 - a, n - 1) * s / math.sqrt(n)
        assert (r["p"] < a) == (-0.05 < m - half and m + half < 0.05)


def test_tost_hand_computed_example():
    # mean 0.01, sd 0.01, n 4: t = (0.01 + 0.05) / 0.005 = 12 and (0.01 - 0.05) / 0.005 = -8, df 3
    x = [0.01 + 0.01 * v for v in (-1.0, 1.0, -1.0, 1.0)]
    x = [0.01 + (v - np.mean(x)) * 0.01 / np.std(x, ddof=1) for v in x]
    r = eq.tost(x, 0.05)
    assert r["p_lower"] == pytest.approx(stats.t.sf(12, 3)) and r["p_upper"] == pytest.approx(stats.t.cdf(-8, 3))
    assert r["p"] == pytest.approx(stats.t.cdf(-8, 3))  # 0.00203


def test_below_and_beyond_margin_tests():
    far = [0.20, 0.22, 0.19, 0.21, 0.20]
    assert eq.beyond_margin_p(far, 0.05) < 1e-4                     # a gap well beyond the margin
    assert eq.below_margin_p(far, 0.05, sign=1) == 1.0              # the claimed 'worse' is not excluded
    assert eq.below_margin_p(far, 0.05, sign=-1) < 1e-4             # a claimed 'better' is: the gap goes the other way
    assert eq.below_margin_p(X, 0.05, sign=1) == pytest.approx(
        2 * stats.ttest_1samp(X, 0.05, alternative="less").pvalue)  # doubled: the two-sided interval's bound
    assert eq.beyond_margin_p(X, 0.05) == 1.0


def test_no_spread_decides_exactly():
    assert eq.one_sided_p([0.1, 0.1, 0.1], 0.05, "greater") == 0.0
    assert eq.tost([0.01, 0.01], 0.05)["p"] == 0.0 and eq.tost([0.06, 0.06], 0.05)["p"] == 1.0


def test_power_of_the_issue_example():
    # 3 seeds, 10 tests (Bonferroni level 0.005), a true gap of 0.15 nats, seed sd 0.045: about 16%
    assert eq.power_two_sided(0.15, 0.045, 3, 0.05 / 10) == pytest.approx(0.157, abs=0.002)


def test_power_and_sample_size_textbook():
    # one-sample t-test, d = 0.5, alpha 0.05 two-sided, power 0.8: n = 34 (G*Power; Cohen's tables), power 0.8078
    assert eq.seeds_needed(lambda n: eq.power_two_sided(0.5, 1.0, n, 0.05)) == 34
    assert eq.power_two_sided(0.5, 1.0, 34, 0.05) == pytest.approx(0.8078, abs=5e-4)
    # d = 0.8: n = 15 (power 0.8213); one-sided, d = 0.5: n = 27 (power 0.8118)
    assert eq.seeds_needed(lambda n: eq.power_two_sided(0.8, 1.0, n, 0.05)) == 15
    assert eq.seeds_needed(lambda n: eq.power_one_sided(0.5, 1.0, n, 0.05)) == 27


def test_mde_inverts_the_power():
    e = eq.mde(0.045, 3, 0.005)
    assert eq.power_two_sided(e, 0.045, 3, 0.005) == pytest.approx(0.8, abs=1e-6)
    assert eq.mde(1.0, 34, 0.05) == pytest.approx(0.4950, abs=0.002)  # just under d = 0.5 at n = 34


@pytest.mark.parametrize("delta,sd,n,margin,alpha", [(0.0, 0.04, 5, 0.05, 0.05), (0.02, 0.03, 8, 0.05, 0.01),
                                                     (0.0, 1.0, 20, 0.5, 0.05)])
def test_tost_power_matches_simulation(delta, sd, n, margin, alpha):
    rng = np.random.default_rng(1)
    x = rng.normal(delta, sd, (200_000, n))
    m, s = x.mean(1), x.std(1, ddof=1)
    hit = np.mean(np.abs(m) + stats.t.ppf(1 - alpha, n - 1) * s / np.sqrt(n) < margin)
    assert eq.power_tost(delta, sd, n, margin, alpha) == pytest.approx(hit, abs=0.004)


def test_tost_sample_size_against_the_normal_formula():
    # true difference 0, margin 0.5 sd, alpha 0.05: normal approximation (z_0.95 + z_0.9)^2 / 0.25 = 34.3; with t a
    # few more
    n = eq.seeds_needed(lambda k: eq.power_tost(0.0, 1.0, k, 0.5, 0.05))
    assert 35 <= n <= 37
    assert eq.power_tost(0.0, 1.0, n, 0.5, 0.05) >= 0.8 > eq.power_tost(0.0, 1.0, n - 1, 0.5, 0.05)


def test_equivalence_bound_and_unreachable_power():
    b = eq.equivalence_bound(0.045, 3, 0.05)
    assert eq.power_tost(0.0, 0.045, 3, b, 0.05) == pytest.approx(0.8, abs=1e-6)
    assert eq.seeds_needed(lambda n: 0.0, max_seeds=64) is None
