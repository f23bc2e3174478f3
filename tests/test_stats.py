import itertools
import json
import math

import numpy as np
import pytest
from scipy import stats

from basecap.report.stats import (
    BETTER, NO_RANGE, TOO_FEW, WORSE, RunCurves, apply_holm, build_comparisons, eval_noise, eval_noise_of_difference, holm,
    matched_endpoints, moving_average, pair_by_seed, paired_test, verdict,
)

NO_DIFF = "no detectable difference"


# ---- paired test over seeds: known values of the t distribution ----

def test_paired_test_known_values():
    t = paired_test([0.1, 0.2, 0.3])  # mean 0.2, sd 0.1, t = 2 sqrt(3), 2 df
    assert (t.n, t.mean, t.sd) == (3, pytest.approx(0.2), pytest.approx(0.1))
    half = 4.302653 * 0.1 / math.sqrt(3)  # t_{0.975, 2}
    assert t.ci95 == pytest.approx((0.2 - half, 0.2 + half), abs=1e-6)
    tt = 2 * math.sqrt(3)
    assert t.p == pytest.approx(1 - tt / math.sqrt(2 + tt * tt), abs=1e-9)  # two-sided p with 2 df in closed form


def test_one_sample_test_of_differences_is_the_paired_test():
    rng = np.random.default_rng(8)
    run, ref = rng.normal(4.1, 0.2, 5), rng.normal(4.0, 0.2, 5)
    assert paired_test(run - ref).p == pytest.approx(stats.ttest_rel(run, ref).pvalue, rel=1e-12)


@pytest.mark.parametrize("n, p", [(2, 1 - 2 / math.pi * math.atan(math.sqrt(2))),  # 1 df: Cauchy
                                  (3, 1 - math.sqrt(3) / math.sqrt(5))])
def test_mean_equal_to_spread_is_far_from_significant(n, p):
    """The old rule "|mean| > sd over seeds" is a t of sqrt(n): p 0.39 at 2 seeds, 0.23 at 3."""
    gaps = [1.0, 0.0] if n == 2 else [0.0, 1.0, 2.0]
    gaps = np.asarray(gaps) - np.mean(gaps) + np.std(gaps, ddof=1)  # mean == sd
    t = paired_test(gaps)
    assert t.p == pytest.approx(p, abs=1e-9)
    assert verdict(t.n, t.mean, t.ci95, t.p).startswith(NO_DIFF)


def test_too_few_seeds_and_two_seeds():
    assert verdict(*_t([])) == TOO_FEW and verdict(*_t([0.3])) == TOO_FEW
    assert paired_test([0.3]).ci95 is None and paired_test([0.3]).p is None
    two = paired_test([0.10, 0.12])
    assert "very wide" in two.note and "12.7" in two.note
    assert two.ci95[0] < 0.11 - 0.1 and two.ci95[1] > 0.11 + 0.1  # half-width 12.7 x 0.01 / sqrt 2 = 0.09


def test_identical_gaps_do_not_crash():
    t = paired_test([0.2, 0.2, 0.2])
    assert t.sd == 0 and t.ci95 == pytest.approx((0.2, 0.2)) and t.p == 0.0
    assert paired_test([0.0, 0.0]).p == 1.0


def _t(gaps):
    t = paired_test(gaps)
    return t.n, t.mean, t.ci95, t.p


# ---- Holm ----

def test_holm_textbook_example():
    # Holm-Bonferroni example with four hypotheses: at alpha 0.05 it rejects those with p 0.005 and 0.01
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.01, 0.02, 0.03, 0.04, 0.05]) == pytest.approx([0.05, 0.08, 0.09, 0.09, 0.09])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1
    assert holm([]) == []


def test_holm_skips_missing_tests():
    out = holm([0.01, None, 0.04])
    assert out[1] is None and out[0] == pytest.approx(0.02) and out[2] == pytest.approx(0.04)


def test_holm_equals_closed_testing_with_bonferroni():
    """Holm is the closed test of Bonferroni intersection tests: adjusted p_i = max over the sets S that
    contain i of min(1, |S| min_{j in S} p_j)."""
    rng = np.random.default_rng(0)
    for _ in range(20):
        p = list(rng.uniform(0, 0.2, size=5))
        closed = [max(min(1.0, len(s) * min(p[j] for j in s))
                      for r in range(1, 6) for s in itertools.combinations(range(5), r) if i in s) for i in range(5)]
        assert holm(p) == pytest.approx(closed, abs=1e-12)


def test_verdict_words_come_from_the_corrected_test():
    assert verdict(5, 0.2, (0.1, 0.3), 0.01) == WORSE
    assert verdict(5, -0.2, (-0.3, -0.1), 0.01) == BETTER
    # uncorrected p 0.02 is below 0.05, but three comparisons raise it to 0.06
    sd = 0.08 * 5 ** 0.5 / stats.t.ppf(0.975, 4)  # the sd that gives the uncorrected interval [0.02, 0.18]
    c = [{"n_seeds": 5, "mean_gap": 0.1, "sd": sd, "ci95": [0.02, 0.18], "p": 0.02}] * 3
    c = apply_holm([dict(x) for x in c])
    assert c[0]["p_holm"] == pytest.approx(0.06)
    # the words give the simultaneous interval (level 1 - 0.05/3 each), which holds 0 like the corrected test
    half = stats.t.ppf(1 - 0.05 / 6, 4) * sd / 5 ** 0.5
    assert c[0]["ci_simultaneous"] == pytest.approx([0.1 - half, 0.1 + half])
    assert c[0]["ci_simultaneous"][0] < 0 < c[0]["ci_simultaneous"][1]
    assert c[0]["verdict"] == f"no detectable difference (simultaneous CI [{0.1 - half:.3f}, {0.1 + half:.3f}])"


def test_a_comparison_holm_does_not_reject_has_a_simultaneous_interval_holding_zero():
    rng = np.random.default_rng(3)
    for _ in range(200):
        m, n = int(rng.integers(1, 9)), int(rng.integers(2, 6))
        comps = []
        for _ in range(m):
            t = paired_test(rng.normal(rng.normal(0, 0.05), 0.05, size=n))
            comps.append({"n_seeds": n, "mean_gap": t.mean, "sd": t.sd, "ci95": list(t.ci95), "p": t.p})
        for c in apply_holm(comps):
            lo, hi = c["ci_simultaneous"]
            if c["p_holm"] >= 0.05:
                assert lo <= 0 <= hi and c["verdict"].startswith(NO_DIFF)
            # the simultaneous interval is never narrower than the uncorrected one
            assert lo <= c["ci95"][0] + 1e-12 and hi >= c["ci95"][1] - 1e-12


# ---- simulated studies of known gap and noise ----

def test_ci_covers_the_true_gap_in_about_95_percent_of_studies():
    rng = np.random.default_rng(1)
    true_gap, covered = 0.05, 0
    for _ in range(100):
        lo, hi = paired_test(true_gap + rng.normal(0, 0.03, size=5)).ci95
        covered += lo <= true_gap <= hi
    assert covered >= 90


def test_zero_gap_gives_no_detectable_difference_at_the_nominal_rate():
    rng = np.random.default_rng(2)
    clean = 0
    for _ in range(100):  # a report of 6 comparisons, all with no true gap: Holm keeps the familywise error <= 5%
        comps = [{"n_seeds": 3, **dict(zip(("mean_gap", "ci95", "p"), _t(rng.normal(0, 0.05, size=3))[1:]))}
                 for _ in range(6)]
        clean += all(c["verdict"].startswith(NO_DIFF) for c in apply_holm(comps))
    assert clean >= 90
    p = np.array([paired_test(rng.normal(0, 0.05, size=3)).p for _ in range(1000)])
    assert 0.03 <= (p < 0.05).mean() <= 0.07  # uncorrected false-positive rate near 5%


def test_large_gap_with_enough_seeds_is_detected():
    rng = np.random.default_rng(3)
    for sign, word in ((1, WORSE), (-1, BETTER)):
        comps = [{"n_seeds": 5, **dict(zip(("mean_gap", "ci95", "p"), _t(sign * 0.2 + rng.normal(0, 0.05, size=5))[1:]))},
                 {"n_seeds": 5, **dict(zip(("mean_gap", "ci95", "p"), _t(rng.normal(0, 0.05, size=5))[1:]))}]
        assert apply_holm(comps)[0]["verdict"] == word


def _study(rng, gap, seeds, evals=12, seed_sd=0.03, eval_sd=0.02, gap_at=None):
    """Runs 'ref' and 'other' per seed: OOD loss = in-domain loss + 1 (+ gap for 'other'), with a per-seed
    offset (training randomness) and per-evaluation noise; the two runs train at different paces."""
    runs = []
    for s in range(seeds):
        for name, g, pace in (("ref", 0.0, 0.0), ("other", gap, 0.2)):
            x = np.linspace(5.0, 3.0, evals) + pace + rng.normal(0, 0.01, evals)
            g_x = g if gap_at is None else g * (x < gap_at)
            y = x + 1 + g_x + (rng.normal(0, seed_sd) if name == "other" else 0) + rng.normal(0, eval_sd, evals)
            runs.append(RunCurves(name, s, x, {"code": y}))
    return runs


def test_end_to_end_coverage_from_simulated_curves():
    rng = np.random.default_rng(4)
    true_gap, covered = 0.1, 0
    for _ in range(100):
        [c] = build_comparisons(pair_by_seed(_study(rng, true_gap, 4), "ref"), ["code"])
        covered += c["ci95"][0] <= true_gap <= c["ci95"][1]
    assert covered >= 90


# ---- endpoints from curves ----

def test_primary_endpoint_sees_a_gap_only_at_the_trained_end():
    x = np.linspace(5.0, 3.0, 201)
    ref = x + 1
    run = x + 1 + 0.3 * (x <= 3.6)  # worse only over the lowest 30% of the in-domain range
    g = matched_endpoints(x, run, x, ref, smooth=1, points=400)
    assert g.primary_range == pytest.approx((3.0, 3.6))
    assert g.primary == pytest.approx(0.3, abs=0.01)
    assert g.mean_gap == pytest.approx(0.09, abs=0.01)  # the whole-range mean dilutes it
    assert g.end_gap == pytest.approx(0.3)
    assert matched_endpoints(x, run, x, ref).primary == pytest.approx(0.3, abs=0.02)  # smoothed by 3 by default


def test_primary_endpoint_matches_the_old_gap_for_a_constant_offset():
    x = np.linspace(5.0, 3.0, 10)
    g = matched_endpoints(x + 0.3, x + 0.3 + 1.5, x, x + 1.0)  # different pace, same curve shape
    assert (g.primary, g.mean_gap, g.end_gap) == pytest.approx((0.5, 0.5, 0.5))
    assert g.matched_range == pytest.approx((3.3 + 2 / 9, 5.0 - 2 / 9))  # smoothing by 3 trims one step at each end


def test_unsorted_in_domain_losses_are_interpolated_in_order():
    x = np.array([5.0, 4.0, 4.2, 3.0])  # the in-domain loss went up once
    g = matched_endpoints(x, 2 * x, x, 2 * x - 0.1, smooth=1)
    assert g.primary == pytest.approx(0.1) and g.mean_gap == pytest.approx(0.1)


def test_smoothing_is_a_moving_average_over_consecutive_evaluations():
    assert moving_average([1, 2, 3, 4, 5], 3) == pytest.approx([2, 3, 4])
    x = np.linspace(5.0, 3.0, 30)
    zigzag = 0.3 * (-1.0) ** np.arange(30)  # evaluation noise that alternates sign
    raw = matched_endpoints(x, x + 1 + zigzag, x, x + 1, smooth=1)
    smooth = matched_endpoints(x, x + 1 + zigzag, x, x + 1, smooth=2)
    assert smooth.smoothing == 2 and smooth.primary == pytest.approx(0.0, abs=1e-9)
    assert abs(raw.end_gap) > 0.25 and abs(smooth.end_gap) < 1e-9


def test_too_few_evaluations_to_smooth_says_so():
    x = np.array([5.0, 4.0, 3.0])
    g = matched_endpoints(x, x + 0.2, x, x, smooth=3)
    assert g.ok and g.smoothing == 1 and g.primary == pytest.approx(0.2)
    assert "not smoothed" in g.notes[0]
    assert not matched_endpoints([5.0], [6.0], x, x).ok


def test_non_overlapping_ranges_give_a_reason():
    a, b = np.linspace(5.0, 4.0, 6), np.linspace(3.5, 2.0, 6)
    g = matched_endpoints(a, a + 1, b, b + 1)
    assert not g.ok and g.primary is None and "do not overlap" in g.reason
    runs = [RunCurves("ref", 0, b, {"code": b + 1}), RunCurves("other", 0, a, {"code": a + 1})]
    [c] = build_comparisons(pair_by_seed(runs, "ref"), ["code"])
    # the verdict names the reason, not a shortage of seeds (a short run whose curves never meet)
    assert c["n_seeds"] == 0 and c["verdict"].startswith(NO_RANGE) and "do not overlap" in c["notes"][0]
    assert c["unmatched_seeds"] == 1 and TOO_FEW not in c["verdict"]


# ---- evaluation noise ----

def test_bootstrap_standard_error_of_one_evaluation():
    rng = np.random.default_rng(5)
    w = rng.normal(4.0, 0.8, size=400)
    e = eval_noise(w)
    assert e["value"] == pytest.approx(w.mean())
    assert e["se"] == pytest.approx(w.std(ddof=1) / 20, rel=0.15)
    assert e["ci95"][0] < w.mean() < e["ci95"][1]


def test_paired_bootstrap_cancels_shared_window_difficulty():
    rng = np.random.default_rng(6)
    hard = rng.normal(4.0, 1.0, size=256)  # how hard each window's text is, for both runs
    run, ref = hard + 0.05 + rng.normal(0, 0.05, 256), hard + rng.normal(0, 0.05, 256)
    d = eval_noise_of_difference(run, ref)
    assert d["value"] == pytest.approx(run.mean() - ref.mean())
    assert d["se"] == pytest.approx(np.std(run - ref, ddof=1) / 16, rel=0.15)
    assert d["se"] < eval_noise(run)["se"] / 5
    assert eval_noise_of_difference(ref + 0.1, ref)["se"] == 0.0
    with pytest.raises(ValueError, match="same windows"):
        eval_noise_of_difference(run, ref[:10])


# ---- the comparisons list of summary.json ----

def test_build_comparisons_fields_and_json():
    rng = np.random.default_rng(7)
    runs = _study(rng, 0.3, 3)
    for r in runs:
        r.final_windows = {"code": rng.normal(r.domains["code"][-1], 0.5, size=64)}
    runs += [RunCurves("third", s, np.linspace(5.0, 3.0, 12), {"code": np.linspace(6.0, 4.0, 12)}) for s in range(2)]
    comps = build_comparisons(pair_by_seed(runs, "ref"), ["code", "docs"])
    json.dumps(comps, allow_nan=False)
    assert [(c["run"], c["reference"], c["domain"], c["n_seeds"]) for c in comps] == [("other", "ref", "code", 3),
                                                                                     ("third", "ref", "code", 2)]
    need = {"run", "reference", "domain", "n_seeds", "per_seed", "mean_gap", "ci95", "p", "p_holm", "verdict",
            "secondary_mean_gap"}
    assert need <= set(comps[0])
    other = comps[0]
    assert other["verdict"] == WORSE and other["p_holm"] == pytest.approx(min(1, 2 * other["p"]))
    assert other["mean_gap"] == pytest.approx(np.mean(other["per_seed"]))
    assert other["eval_se"] > 0 and other["dominant_noise"] in ("seeds", "evaluation")
    assert comps[1]["eval_se"] is None and "very wide" in comps[1]["notes"][-1]


def test_pairs_must_share_a_seed():
    x = np.linspace(5.0, 3.0, 5)
    with pytest.raises(ValueError, match="share a seed"):
        build_comparisons([(RunCurves("a", 0, x, {"code": x}), RunCurves("ref", 1, x, {"code": x}))], ["code"])
