"""The comparison design (report.design): one in-domain band per study, OOD loss on seen targets, annealed points,
the mixed-domain control matched on the limited setting's training domain and tested as an interaction. Every case
has a known answer built into synthetic run records."""

import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from basecap.report import report
from basecap.report.stats import matched_endpoints

BAND = [3.4, 3.8]


def test_band_gap_known_answer_and_level_dependence():
    # the gap grows linearly as the in-domain loss falls: gap(x) = 0.5 * (5 - x); over the band 3.4-3.8 its mean is 0.7
    x = np.linspace(5.0, 3.0, 21)
    g = matched_endpoints(x, x + 0.5 * (5 - x), x, x, smooth=1, band=(3.4, 3.8))
    assert g.primary == pytest.approx(0.7, abs=1e-9) and g.primary_range == (3.4, 3.8)
    # the same pair read at the lowest 30% of its range (3.0-3.6) says 0.85: the level moves the answer
    assert matched_endpoints(x, x + 0.5 * (5 - x), x, x, smooth=1).primary == pytest.approx(0.85, abs=1e-9)


def test_a_band_outside_the_common_range_gives_no_gap():
    x = np.linspace(5.0, 3.9, 12)
    g = matched_endpoints(x, x, x, x, smooth=1, band=(3.4, 3.8))
    assert not g.ok and "not inside the common in-domain range" in g.reason


def write_run(
    root, name, seed, *, weights=None, gap=0.0, rare_gap=0.0, anneal_gap=None, pace=1.0, mixed_gap=None, model=None, anneal_at=(4.3, 3.9, 3.5)
):
    """A run whose in-domain (prose) loss falls from 5 to 3 over 11 evaluations (``pace`` stretches it); its code loss is
    the in-domain loss + 1 + ``gap`` on seen targets and + ``rare_gap`` more on rare ones (a fifth of the targets), so the
    all-target gap is gap + rare_gap / 5. Annealed points: at three forks, 0.2 lower in-domain, their code gap
    ``anneal_gap`` (default: ``gap``). A mixed run (``weights``) trains on code too: its in-domain loss is the mean of
    prose and code, and code sits ``mixed_gap`` above the reference's at the same prose loss."""
    d = root / f"{name}-s{seed}"
    d.mkdir(parents=True)
    weights = weights or {"prose": 1.0}
    (d / "run.json").write_text(
        json.dumps(
            {
                "run_id": f"{name}-s{seed}",
                "params": {"total": 10, "non_embedding": 8},
                "config": {"name": name, "seed": seed, "data": {"train_weights": weights}, "model": model or {"mixer": {"name": name}}},
            }
        )
    )
    recs = []

    def point(x, g):
        seen = x + 1 + g
        rare = seen + 2 + rare_gap
        code = {
            "loss": 0.8 * seen + 0.2 * rare,
            "bpb": 1.0,
            "tokens": 100,
            "strata": {"seen": {"loss": seen, "tokens": 80}, "rare": {"loss": rare, "tokens": 20}, "unseen": {"loss": None, "tokens": 0}},
        }
        prose = {"loss": x, "bpb": 1.0, "tokens": 100, "strata": {"seen": {"loss": x, "tokens": 100}}}
        doms = {"prose": prose, "code": code}
        ind = x if "code" not in weights else (x + code["loss"]) / 2
        return ind, doms

    xs = 5.0 - (np.arange(1, 12) / 11) * 2.0 * pace
    for i, x in enumerate(xs):
        g = mixed_gap if mixed_gap is not None else gap
        ind, doms = point(float(x), g)
        recs.append({"kind": "train", "step": i + 1, "loss": ind})
        recs.append({"kind": "eval", "step": 10 * (i + 1), "in_domain_loss": ind, "domains": doms})
    for j, x in enumerate(anneal_at):
        ind, doms = point(x - 0.2, gap if anneal_gap is None else anneal_gap)
        recs.append({"kind": "anneal", "step": 30 * (j + 1), "end_step": 36 * (j + 1), "in_domain_loss": ind, "domains": doms})
    recs.sort(key=lambda r: r["step"])
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return d


def study(root, design, runs):
    out = root / "runs"
    out.mkdir()
    (out / "experiment.json").write_text(json.dumps({"name": "s", "size": None, "compare": design}))
    return [write_run(out, *a, **k) for a, k in runs]


def by(summary, measure, run, domain="code"):
    return next(c for c in summary["comparisons_by_measure"][measure] if c["run"] == run and c["domain"] == domain)


def test_seen_targets_and_annealed_points_take_out_what_the_design_is_built_to_remove(tmp_path):
    design = {"band": BAND, "targets": "seen", "points": "annealed"}
    runs = []
    for s in (0, 1, 2):
        runs.append((("ref", s), {}))
        # a fast learner: worse only on rare targets (+1.0 there, +0.2 on all targets), and +0.3 more off its annealed
        # points (as a run at a high rate, not annealed, would be); on seen targets at annealed points: 0.05 + seed noise
        runs.append((("fast", s), {"gap": 0.3 + 0.01 * s, "rare_gap": 1.0, "anneal_gap": 0.05 + 0.01 * s, "pace": 1.3}))
    dirs = study(tmp_path, design, runs)
    report(dirs, tmp_path / "rep", reference="ref")
    summary = json.loads((tmp_path / "rep" / "summary.json").read_text())
    assert summary["design"]["primary"] == "annealed_seen"
    assert by(summary, "annealed_seen", "fast")["mean_gap"] == pytest.approx(0.06, abs=1e-9)
    assert by(summary, "annealed_all", "fast")["mean_gap"] == pytest.approx(0.06 + 0.2, abs=1e-9)
    assert by(summary, "evals_seen", "fast")["mean_gap"] == pytest.approx(0.31, abs=1e-9)
    assert by(summary, "evals_all", "fast")["mean_gap"] == pytest.approx(0.51, abs=1e-9)
    assert summary["comparisons"] == summary["comparisons_by_measure"]["annealed_seen"]
    # points inside the band, the run's and its reference's: evaluations at 3.73 and 3.55 for the reference, 3.58 for
    # the faster run; one annealed point each (3.7)
    assert by(summary, "evals_seen", "fast")["points_in_band"] == {"run": 1, "reference": 2}
    assert by(summary, "annealed_seen", "fast")["points_in_band"] == {"run": 1, "reference": 1}
    assert summary["strata_shares"]["prose"]["code"] == {"seen": 0.8, "rare": 0.2, "unseen": 0.0}
    # every annealed curve reaches 4.1 (the first fork) down to 3.0 (the reference's end; the faster run ends at 2.4)
    assert summary["reach"]["common"] == pytest.approx([3.0, 4.1]) and summary["reach"]["band_held"]
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "## Comparison design" in md and "## The gap under each measure" in md and (tmp_path / "rep" / "gap_vs_level.png").is_file()


def test_mixed_control_matched_on_prose_and_the_interaction(tmp_path):
    design = {"band": BAND, "targets": "all", "points": "evals", "match_domains": ["prose"]}
    mixed = {"prose": 1.0, "code": 1.0}
    runs = []
    for s in (0, 1, 2):
        runs += [
            (("ref", s), {"model": {"a": 1}}),
            (("arch", s), {"gap": 0.2 + 0.02 * s, "model": {"b": 1}}),
            (("ref_mixed", s), {"weights": mixed, "model": {"a": 1}, "mixed_gap": 0.0}),
            (("arch_mixed", s), {"weights": mixed, "model": {"b": 1}, "mixed_gap": -0.1 + 0.01 * s}),
        ]
    dirs = study(tmp_path, design, runs)
    report(dirs, tmp_path / "rep", reference="ref")
    summary = json.loads((tmp_path / "rep" / "summary.json").read_text())
    lim, mix = by(summary, "evals_all", "arch"), by(summary, "evals_all", "arch_mixed")
    assert lim["mean_gap"] == pytest.approx(0.22 + 0.0, abs=1e-9)  # seen gap + rare_gap/5 (0)
    assert mix["mean_gap"] == pytest.approx(-0.09, abs=1e-9)  # matched on prose, the mixed gap is what was built in
    (inter,) = summary["interactions"]
    assert (inter["run"], inter["mixed_run"], inter["domain"]) == ("arch", "arch_mixed", "code")
    assert inter["per_seed"] == pytest.approx([0.3, 0.31, 0.32])
    assert inter["verdict"] == "limited gap larger"


def test_studies_without_a_design_keep_their_summary(tmp_path):
    runs = [(("ref", s), {}) for s in (0, 1)] + [(("other", s), {"gap": 0.1}) for s in (0, 1)]
    dirs = study(tmp_path, None, runs)
    report(dirs, tmp_path / "rep", reference="ref")
    summary = json.loads((tmp_path / "rep" / "summary.json").read_text())
    assert not {"design", "comparisons_by_measure", "interactions"} & set(summary)


def test_report_applies_a_design_given_on_the_command_line(tmp_path):
    from basecap.cli import main
    from basecap.config_base import ConfigError
    from basecap.report.design import load_design

    runs = [(("ref", s), {}) for s in (0, 1)] + [(("other", s), {"gap": 0.1 + 0.01 * s}) for s in (0, 1)]
    dirs = study(tmp_path, None, runs)
    (tmp_path / "c.toml").write_text('[compare]\nband = [3.4, 3.8]\ntargets = "all"\npoints = "evals"\n')
    main(["report", *map(str, dirs), "--reference", "ref", "--compare", str(tmp_path / "c.toml"), "--out", str(tmp_path / "rep")])
    summary = json.loads((tmp_path / "rep" / "summary.json").read_text())
    assert summary["design"]["primary"] == "evals_all" and by(summary, "evals_all", "other")["mean_gap"] == pytest.approx(0.105)
    (tmp_path / "bad.toml").write_text("[compare]\nband = [3.8, 3.4]\n")
    with pytest.raises(ConfigError, match="low < high"):
        load_design(tmp_path / "bad.toml")
    (tmp_path / "none.toml").write_text("name = 'x'\n")
    with pytest.raises(ConfigError, match=r"no \[compare\] table"):
        load_design(tmp_path / "none.toml")
    # an experiment file that sets the design per size: the table of the file's own size
    (tmp_path / "exp.toml").write_text('size = "small"\n[sizes.small]\ncompare = { band = [4.4, 4.6], targets = "seen", points = "annealed" }\n')
    assert load_design(tmp_path / "exp.toml")["band"] == [4.4, 4.6]
    assert "study_file" not in load_design(tmp_path / "exp.toml")  # no name: not an experiment file
    (tmp_path / "exp.toml").write_text('name = "s"\n' + (tmp_path / "exp.toml").read_text())
    assert load_design(tmp_path / "exp.toml")["study_file"] == "exp.toml"


def test_a_size_carries_its_own_design(tmp_path):
    """A band in nats belongs to one scale: sizes.<s>.compare is the design at that size only, validated at every size."""
    from basecap.config import load_experiment
    from basecap.config_base import ConfigError

    text = 'name = "x"\nsize = "small"\n[[runs]]\nname = "a"\n[sizes.small]\ncompare = { band = [4.0, 4.2] }\n[sizes.big]\ntrain = { steps = 100 }\n'
    (tmp_path / "x.toml").write_text(text)
    assert load_experiment(tmp_path / "x.toml").compare.band == (4.0, 4.2)
    assert load_experiment(tmp_path / "x.toml", ["size=big"]).compare is None
    (tmp_path / "y.toml").write_text(text.replace("[4.0, 4.2] }\n[sizes.big]", "[4.0, 4.2] }\n[sizes.big]\ncompare = { band = [2, 1] }"))
    with pytest.raises(ConfigError, match="low < high"):
        load_experiment(tmp_path / "y.toml")


def test_a_curve_that_cannot_reach_the_band_is_named_and_the_rule_gives_a_band_inside_every_reach(tmp_path):
    # a slow run annealed only at 4.3, 4.1 and 3.85 and ending at 4.0: the band 3.4-3.6 is beyond it; the rule's band
    # starts at the lowest loss every curve reaches (3.85, a multiple of 0.05) and keeps the width: 3.85-4.05, inside
    # the reference's reach (its highest annealed point is 4.1)
    design = {"band": [3.4, 3.6], "targets": "seen", "points": "annealed"}
    runs = [(("ref", s), {}) for s in (0, 1)] + [(("slow", s), {"pace": 0.5, "anneal_at": (4.5, 4.3, 4.05)}) for s in (0, 1)]
    report(study(tmp_path, design, runs), tmp_path / "rep", reference="ref")
    summary = json.loads((tmp_path / "rep" / "summary.json").read_text())
    r = summary["reach"]
    assert r["runs"]["slow"]["lowest"] == pytest.approx(3.85) and r["runs"]["ref"]["highest"] == pytest.approx(4.1)
    assert not r["band_held"] and r["rule_band"] == pytest.approx([3.85, 4.05])
    assert by(summary, "annealed_seen", "slow")["mean_gap"] is None
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "does not lie inside" in md and "gives 3.85-4.05" in md and "`slow`" in md
    # a wider band has no place inside every reach: said, and no band is offered
    design["band"] = [3.4, 3.8]
    (tmp_path / "runs" / "experiment.json").write_text(json.dumps({"name": "s", "size": None, "compare": design}))
    report(sorted((tmp_path / "runs").glob("*-s*")), tmp_path / "rep2", reference="ref")
    assert json.loads((tmp_path / "rep2" / "summary.json").read_text())["reach"]["rule_band"] is None
    assert "No band of the same width" in (tmp_path / "rep2" / "report.md").read_text()


def test_an_ablation_of_two_base_architectures_compares_each_variant_with_its_own_base(tmp_path):
    from basecap.cli import main

    design = {"band": BAND, "targets": "seen", "points": "annealed"}
    runs = []
    for s in (0, 1, 2):
        runs += [
            (("a_base", s), {"model": {"mixer": {"name": "A"}}}),
            (("a_var", s), {"gap": 0.1, "model": {"mixer": {"name": "A"}}}),
            (("b_base", s), {"gap": 0.5, "model": {"mixer": {"name": "B"}}}),
            (("b_var", s), {"gap": 0.5 + 0.3 + 0.01 * s, "model": {"mixer": {"name": "B"}}}),
        ]
    dirs = study(tmp_path, design, runs)
    main(["report", *map(str, dirs), "--out", str(tmp_path / "rep"), "--reference", "a_base", "--reference", "b_base"])
    summary = json.loads((tmp_path / "rep" / "summary.json").read_text())
    assert summary["references"] == ["a_base", "b_base"] and summary["reference"] == "a_base"
    got = {(c["run"], c["reference"]): c["mean_gap"] for c in summary["comparisons"]}
    assert got == pytest.approx({("a_var", "a_base"): 0.1, ("b_var", "b_base"): 0.31})  # no base against the other
    assert {(c["run"], c["reference"]) for c in summary["in_domain_comparisons"]} == {("a_var", "a_base"), ("b_var", "b_base")}
    assert "against `a_base` / `b_base` (each run against the reference of its own mixer)" in (tmp_path / "rep" / "report.md").read_text()
    # one reference: every run against it, as before
    report(dirs, tmp_path / "rep1", reference="a_base")
    one = json.loads((tmp_path / "rep1" / "summary.json").read_text())
    assert {c["run"] for c in one["comparisons"]} == {"a_var", "b_base", "b_var"} and one["references"] == ["a_base"]


def test_runs_from_two_folders_of_one_study_keep_its_design_and_two_designs_are_an_error(tmp_path):
    """A study's archived records and its newly trained runs sit in two folders; the design both experiment files
    give is used (before, runs from two folders fell back to the old design without a word). Folders whose
    designs differ are an error that asks for --compare; a folder without an experiment file does not vote."""
    import shutil

    from basecap.config_base import ConfigError

    design = {"band": BAND, "targets": "seen", "points": "annealed"}
    runs = [((name, s), {"gap": 0.1 if name == "b" else 0.0}) for s in (0, 1, 2) for name in ("ref", "b")]
    (tmp_path / "archived").mkdir()
    (tmp_path / "new").mkdir()
    dirs = study(tmp_path / "archived", design, runs)
    assert study(tmp_path / "new", design, []) == []  # the same study's folder, its experiment file only
    new = tmp_path / "new" / "runs"
    for d in [d for d in dirs if d.name.startswith("b-")]:
        shutil.move(str(d), new / d.name)
    split = sorted((tmp_path / "archived" / "runs").glob("*-s*")) + sorted(new.glob("*-s*"))
    report(split, tmp_path / "rep", reference="ref")
    assert json.loads((tmp_path / "rep" / "summary.json").read_text())["design"]["primary"] == "annealed_seen"
    (new / "experiment.json").unlink()  # no experiment file: that folder does not vote
    report(split, tmp_path / "rep", reference="ref")
    assert json.loads((tmp_path / "rep" / "summary.json").read_text())["design"]["primary"] == "annealed_seen"
    (new / "experiment.json").write_text(json.dumps({"name": "s", "size": None, "compare": {**design, "band": [3.0, 3.2]}}))
    with pytest.raises(ConfigError, match="compare differently.*--compare FILE"):
        report(split, tmp_path / "rep", reference="ref")


def test_a_compare_table_without_a_band_is_an_error_before_anything_trains(tmp_path):
    """A study that asks for the comparison design (annealed points, seen targets) but names no band would report the
    legacy measure without a word: refused when the file is loaded, naming the missing band."""
    from basecap.config import load_experiment
    from basecap.config_base import ConfigError
    from basecap.report.design import load_design

    text = 'name = "x"\nsize = "small"\n[[runs]]\nname = "a"\n[compare]\ntargets = "seen"\npoints = "annealed"\n'
    (tmp_path / "x.toml").write_text(text)
    with pytest.raises(ConfigError, match="band is required"):
        load_experiment(tmp_path / "x.toml")
    (tmp_path / "c.toml").write_text('[compare]\ntargets = "seen"\n')
    with pytest.raises(ConfigError, match="band is required"):
        load_design(tmp_path / "c.toml")


def _fake_run(name: str, seed: int, points: list[tuple[int, float, float]], steps: int = 100):
    """A run whose annealed points are (fork step, in-domain loss, docs loss on every target); the last is its end."""
    from basecap.report.runs import Run

    recs = [{"step": s, "end_step": s + max(1, s // 5), "in_domain_loss": x, "domains": {"docs": {"loss": y}}} for s, x, y in points]
    end = dict(recs[-1], step=steps)
    return Run(Path("."), f"{name}-s{seed}", name, seed, {"config": {"train": {"steps": steps}}}, [], [end], recs[:-1])


def test_gap_curves_known_answers():
    """The gap along training: a constant offset gives that offset at every level and fraction, with a zero-width
    band when every seed agrees; the band is the t interval over seeds; no extrapolation beyond a pair's range."""
    from basecap.report.design import Measure, gap_curve, gap_fraction_curve

    m = Measure("annealed_all", "annealed", "all", True)
    design = {"band": [4.0, 4.2]}
    ref_pts = [(10, 5.0, 6.0), (30, 4.5, 5.5), (60, 4.0, 5.0), (100, 3.5, 4.5)]
    pairs = []
    for seed, off in enumerate([0.1, 0.2, 0.3]):  # OOD = in-domain + 1 + off for the run, + 1 for the reference
        run = _fake_run("arch", seed, [(s, x, x + 1 + off) for s, x, _ in ref_pts])
        pairs.append((run, _fake_run("ref", seed, ref_pts)))
    c = gap_curve(pairs, m, design, "docs")
    assert c is not None and np.allclose(c.mean, 0.2) and (c.n == 3).all()
    half = stats.t.ppf(0.975, 2) * 0.1 / np.sqrt(3)
    assert np.allclose(c.lo, 0.2 - half) and np.allclose(c.hi, 0.2 + half)
    f = gap_fraction_curve(pairs, m, design, "docs")
    assert f is not None and f.x[0] == pytest.approx(0.1) and f.x[-1] == 1.0 and np.allclose(f.mean, 0.2)
    # a run that stops at 4.5 has no gap below it: NaN there, not an extrapolation
    short = [(_fake_run("arch", 0, [(10, 5.0, 6.1), (30, 4.5, 5.6)]), _fake_run("ref", 0, ref_pts))]
    c = gap_curve(short, m, design, "docs")
    assert c is not None and c.x.min() == pytest.approx(4.5) and np.allclose(c.mean, 0.1) and np.isnan(c.lo).all()
    f = gap_fraction_curve(short, m, design, "docs")
    assert f is not None and np.allclose(f.mean[f.x <= 0.3], 0.1) and np.isnan(f.mean[f.x > 0.31]).all()
