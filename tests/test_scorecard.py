"""The scorecard: the claims file's validation, the claim -> comparison adapter against the reports' summary.json,
the verdict rules, and the generated files (SCORECARD.md, scorecard.json, README blocks) against the committed ones;
every interval and Holm p quoted by hand in a study README against summary.json."""

import glob
import json
import re
import shutil
from pathlib import Path

import pytest

from basecap.config_base import ConfigError
from basecap.scorecard import build_scorecard, load_claims
from basecap.scorecard.claims import Claim
from basecap.scorecard.compute import load_study, pair_gaps, slope
from basecap.scorecard.render import generated_files, stale_files
from basecap.scorecard.render_claims import scorecard_markdown
from basecap.scorecard.render_readme import STUDY_MARKERS, readme_results
from basecap.scorecard.robust import combine
from basecap.scorecard.sequential import Plan
from basecap.scorecard.verdicts import FAILS, HOLDS, UNDECIDED, decide, claim_tests

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def card():
    return build_scorecard(ROOT)


def test_every_claim_of_the_paper_has_a_row(card):
    ids = {r["id"] for r in card["claims"]}
    sections = {r["section"] for r in card["claims"]}
    assert {"1-2", "1, 3", "4", "5", "7"} <= sections
    for must in ("limited_exposes_mixed_hides", "mamba2_worse", "mamba1_worse", "gated_deltanet_worse", "rwkv6_worse",
                 "deltanet_worse", "decay_mamba2_shared", "short_conv_mamba2", "mamba2_out_norm", "position_alibi_hurts",
                 "window_larger_helps", "random_constant_hurts", "sharper_softmax_helps", "chunk_approx_hurts_a_little",
                 "top1_chunk_approx_keeps", "fewshot_top1_on_par", "swde_top1_element", "speed_100k_top1_chunk",
                 "sniah_100k_top1_chunk"):
        assert must in ids
    rows = {r["id"]: r for r in card["claims"]}
    # every baseline of architectures_more is answered there (Based was the last to train); GPU rows say "not run"
    assert rows["based_worse"]["verdict"] != "not run" and rows["based_worse"]["results"] == "architectures_more"
    assert rows["fewshot_top1_on_par"]["verdict"] == "not run" and "GPU" in rows["fewshot_top1_on_par"]["detail"]
    # the shared-rate control is arm A of the claim (the learning rate held equal), arm B beside it
    assert [a["label"] for a in rows["mamba2_worse"]["arms"]] == ["A: both at 2e-3", "B: both at 8e-3"]
    assert rows["mamba2_worse"]["arms"][0]["run"] == "mamba2_lr2e-3" and rows["mamba2_worse"]["arms"][1]["reference"] == "transformer_pp_lr8e-3"
    assert rows["mamba2_worse"]["results"] == "architectures_annealed" and rows["mamba2_worse"]["before"]["study"] == "architectures"


def test_pair_claims_reproduce_the_reports_gaps(card):
    """The adapter runs the report's matching on the archived records: its per-seed gaps equal summary.json's."""
    checked = 0
    for r in card["claims"]:
        if r["results"] is None or r.get("band") or r.get("metric") != "ood_gap":
            continue  # a pair read at its rule band is not the report's reading; a speed or accuracy has no report gap
        summary = json.loads((ROOT / "results" / r["results"] / "summary.json").read_text())
        for pair, by_domain in r["parts"].items():
            run, ref = pair.split(" vs ")
            for domain, per_seed in by_domain.items():
                c = [c for c in summary["comparisons"] if (c["run"], c["reference"], c["domain"]) == (run, ref, domain)]
                if c:
                    assert [int(s) for s in per_seed] == c[0]["seeds"]
                    assert list(per_seed.values()) == pytest.approx(c[0]["per_seed"], abs=1e-12)
                    checked += 1
    assert checked >= 20


def test_new_comparison_from_archived_records():
    """A pair no report made (Approx against Exact) is computed from the records, paired by seed."""
    st = load_study(ROOT / "results" / "top1")
    gaps, _ = pair_gaps(st, "top1_chunk_approx", "top1_chunk_exact", ["docs", "code"])
    assert sorted(gaps) == ["code", "docs"] and sorted(gaps["docs"]) == [0, 1, 2]


def test_copies_are_found_and_counted(card):
    # the published studies' records (a folder with summary.json); records archived ahead of a study's report (its
    # runs kept so far, e.g. results/ablation_position_1k/runs) are not counted until it is published
    records = [r for r in glob.glob(str(ROOT / "results" / "*" / "runs" / "*-s*" / "run.json"))
               if (Path(r).parents[2] / "summary.json").is_file()]
    published_source = [c for c in card["copies"] if c["copy_of"]]  # a copy of a study not published is the only record of its run
    assert card["run_records"] == len(records) >= 103 and card["distinct_runs"] == len(records) - len(published_source)
    assert len(card["copies"]) >= 33
    copy = {(c["study"], c["run"]): c["copy_of"] for c in card["copies"]}
    assert copy[("architectures", "sliding_window-s0")] == "ablation_window/runs/window_256-s0"
    assert copy[("top1", "mamba2-s1")] == "limited_vs_mixed/runs/mamba2-s1"
    rows = {r["id"]: r for r in card["claims"]}
    # the top1 study compares against copies of the reference; the comparison-design study trained its own
    assert {c["run"] for c in rows["top1_element_keeps"]["reused"]} >= {"transformer_pp-s0", "transformer_pp-s2"}
    assert not rows["gated_deltanet_worse"]["reused"]


def _claims(tmp_path, edit):
    text = (ROOT / "experiments/paper/claims.toml").read_text()
    p = tmp_path / "claims.toml"
    p.write_text(edit(text))
    return p


def test_unknown_run_study_or_key_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="'mamba3' is not a run of architectures.toml"):
        load_claims(_claims(tmp_path, lambda t: t.replace('run = "mamba1"', 'run = "mamba3"', 1)), ROOT)
    with pytest.raises(ConfigError, match="unknown study 'architecturez'"):
        load_claims(_claims(tmp_path, lambda t: t.replace('study = "architectures"', 'study = "architecturez"', 1)), ROOT)
    with pytest.raises(ConfigError, match="margn"):
        load_claims(_claims(tmp_path, lambda t: t.replace("margin = 0.05", "margn = 0.05", 1)), ROOT)
    with pytest.raises(ConfigError, match="direction"):
        load_claims(_claims(tmp_path, lambda t: t.replace('direction = "falls"', 'direction = "up"', 1)), ROOT)


def test_a_comparison_enters_the_family_once(tmp_path):
    """The same run records under other names (a copy) are the same comparison: a second claim of it is refused."""
    root = tmp_path / "repo"
    shutil.copytree(ROOT / "experiments", root / "experiments")
    (root / "results").mkdir()
    for s in ("top1", "architectures"):
        shutil.copytree(ROOT / "results" / s, root / "results" / s, ignore=shutil.ignore_patterns("*.png", "*.html"))
    # architectures' top1_chunk and transformer_pp records are copies of top1's top1_chunk_approx and transformer_pp
    extra = ('\n[[claims]]\nid = "first"\nsection = "5"\npaper = "x"\nstudy = "top1"\nexpect = "no_effect"\n'
             'run = "top1_chunk_approx"\nreference = "transformer_pp"\n'
             '\n[[claims]]\nid = "again"\nsection = "5"\npaper = "x"\nstudy = "architectures"\nexpect = "no_effect"\n'
             'run = "top1_chunk"\nreference = "transformer_pp"\nseeds = [0, 1, 2]\n')
    p = root / "experiments/paper/claims.toml"
    p.write_text(p.read_text() + extra)
    with pytest.raises(ConfigError, match="repeats the comparison of claim first"):
        build_scorecard(root)


def _row(claim: dict, values, plan=None):
    c = Claim.model_validate({"id": "c", "section": "4", "paper": "p", "study": "s", "reference": "r", **claim})
    t = claim_tests(c, values, 0.05)
    plan = plan or Plan()
    t["p_holds_plan"], t["plan"] = plan.adjust(t["p_holds"], t["n"])
    t["p_fails_plan"], _ = plan.adjust(t["p_fails"], t["n"])
    row = {"claim_obj": c, "family": True, "test": t, "verdict": None, "detail": "", "plan": plan, "arms": []}
    combine(row)
    return row


def test_verdict_rules():
    worse = {"expect": "worse", "run": "a"}
    none = {"expect": "no_effect", "run": "a"}
    rows = [_row(worse, [0.30, 0.31, 0.29, 0.30, 0.32, 0.30]),        # clearly worse: holds
            _row(worse, [-0.30, -0.31, -0.29, -0.30, -0.32, -0.30]),  # clearly the other way: fails
            _row(worse, [0.001, -0.002, 0.0, 0.002, -0.001, 0.0]),    # equivalent to 0: fails
            _row(none, [0.001, -0.002, 0.0, 0.002, -0.001, 0.0]),     # no effect shown: holds
            _row(none, [0.30, 0.31, 0.29, 0.30, 0.32, 0.30]),         # a difference beyond the margin: fails
            _row(worse, [0.2, -0.1, 0.3]),                            # undecided, leaning worse
            _row(none, [0.04, -0.05, 0.09]),                          # undecided
            {"family": True, "test": None, "verdict": "not run", "detail": ""}]  # counts in m with p = 1
    m = decide(rows, 0.05, 0.8)
    assert m == 8
    assert [r["verdict"] for r in rows[:7]] == [HOLDS, FAILS, FAILS, HOLDS, FAILS, UNDECIDED, UNDECIDED]
    und = rows[5]["test"]
    assert und["lean"] == "worse" and und["mde"] > 0.3 and und["seeds_to_decide"] >= 4
    assert "the paper's direction" in rows[5]["detail"] and "MDE" in rows[5]["detail"]
    assert "provable margin" in rows[6]["detail"]
    # one family over both kinds (Shaffer): a hypothesis' adjusted p is at most m x its p
    assert rows[0]["test"]["p_holds_holm"] <= 8 * rows[0]["test"]["p_holds"] + 1e-15


def test_trend_and_interaction_designs():
    t = Claim.model_validate({"id": "t", "section": "4", "paper": "p", "study": "s", "expect": "trend",
                              "direction": "falls", "reference": "full", "x": {"w8": 8, "w64": 64, "full": 256}})
    assert t.sign == -1 and t.runs == ["w8", "w64", "full"]
    with pytest.raises(Exception, match="reference is one of the trend's runs"):
        Claim.model_validate({"id": "t", "section": "4", "paper": "p", "study": "s", "expect": "trend",
                              "direction": "falls", "reference": "full", "x": {"w8": 8, "w16": 16, "w64": 64}})
    with pytest.raises(Exception, match="control_run"):
        Claim.model_validate({"id": "i", "section": "1", "paper": "p", "study": "s", "expect": "interaction",
                              "direction": "larger", "run": "a", "reference": "b"})


def test_committed_outputs_are_what_the_scorecard_writes(card):
    """results/SCORECARD.md, scorecard.json, README.md's Results section and every study README's block."""
    stale = [str(p.relative_to(ROOT)) for p in stale_files(generated_files(card, ROOT))]
    assert not stale, f"out of date, run `basecap scorecard --write-readme`: {stale}"


def test_trend_slope_is_the_least_squares_slope():
    """Closed form with exact sums, against numpy's fit and a hand example (y = 2x + 1 plus symmetric noise)."""
    import numpy as np

    xs, ys = [3.0, 4.0, 6.0, 8.0], [0.0, 0.11, -0.02, 0.3]
    assert slope(xs, ys) == pytest.approx(float(np.polyfit(xs, ys, 1)[0]), rel=1e-12)
    assert slope([0.0, 1.0, 2.0], [1.1, 2.8, 5.1]) == pytest.approx(2.0)


def test_a_json_file_differing_in_the_last_bits_is_current(tmp_path):
    p, q = tmp_path / "a.json", tmp_path / "b.md"
    p.write_text(json.dumps({"x": [0.1 + 0.2, 1, "s"]}), encoding="utf-8")
    q.write_text("0.30000000000000004", encoding="utf-8")
    assert stale_files({p: json.dumps({"x": [0.3, 1, "s"]}), q: "0.30000000000000004"}) == []
    assert stale_files({p: json.dumps({"x": [0.3001, 1, "s"]})}) == [p]
    assert stale_files({p: json.dumps({"x": [0.3, 1, "t"]}), q: "0.3"}) == [p, q]
    assert stale_files({tmp_path / "missing.json": "{}"}) == [tmp_path / "missing.json"]
    p.write_text("{not json", encoding="utf-8")
    assert stale_files({p: "{}"}) == [p]


TRIPLE = re.compile(r"([+-]?\d+\.\d+) \[([+-]?\d+\.\d+), ([+-]?\d+\.\d+)\]")
HOLM = re.compile(r"Holm (\d\.\d+|1)((?:\s*[,/]\s*(?:\d\.\d+|1))*)")


def _close(text: str, value: float) -> bool:
    d = len(text.split(".")[1]) if "." in text else 0
    return abs(float(text) - value) <= 0.5 * 10 ** -d + 1e-12 or float(f"{value:.2g}") == float(text)


def _hand_written(readme: Path) -> list[str]:
    """A README's paragraphs outside the generated block, leaving out those marked exploratory (a comparison
    outside every summary.json, whose command the paragraph gives)."""
    text = re.sub(re.escape(STUDY_MARKERS[0]) + ".*?" + re.escape(STUDY_MARKERS[1]), "", readme.read_text(), flags=re.S)
    # whitespace folded, so that a number and its interval broken across two lines are still read as one
    return [re.sub(r"\s+", " ", p) for p in re.split(r"\n(?=- |\|)", text) if "<!-- exploratory -->" not in p]


@pytest.mark.parametrize("readme", sorted(glob.glob(str(ROOT / "results/*/README.md"))), ids=lambda p: Path(p).parent.name)
def test_numbers_quoted_in_study_readmes_match_summary_json(readme):
    # a study's secondary reports (results/<study>/<analysis>/summary.json, e.g. another band) count as its numbers too
    files = glob.glob(str(ROOT / "results/*/summary.json")) + glob.glob(str(ROOT / "results/*/*/summary.json"))
    summaries = [json.loads(Path(f).read_text()) for f in files]
    by_measure = [c for s in summaries for cs in (s.get("comparisons_by_measure") or {}).values() for c in cs]  # the design's measures
    interactions = [c for s in summaries for c in s.get("interactions") or []]  # limited gap minus mixed gap
    triples = [(c.get("mean_gap", c.get("mean_diff", c.get("mean"))), *c["ci95"]) for s in summaries
               for c in s["comparisons"] + s["in_domain_comparisons"] + by_measure + interactions if c["ci95"]]
    # and the scorecard's claim-level numbers (a claim's mean over its domains, under each specification)
    card = json.loads((ROOT / "results" / "scorecard.json").read_text())
    triples += [(x["estimate"], *x["ci95"]) for r in card["claims"] for x in r.get("specs") or [] if x.get("ci95")]
    # and a superseded study's estimate, kept beside the claim ("before the comparison design")
    triples += [(r["before"]["mean"], *r["before"]["ci95"]) for r in card["claims"] if (r.get("before") or {}).get("ci95")]
    # and a `basecap compare` row's arms (compare.json: the scorecard's measure, the mean of the held-out domains)
    for f in glob.glob(str(ROOT / "results/*/compare.json")):
        arms = json.loads(Path(f).read_text())["arms"]
        triples += [(a["gap"], *a["ci95"]) for a in arms if a.get("ci95")]
        triples += [(x["gap"], *x["ci95"]) for a in arms for x in a.get("specs") or [] if x.get("ci95")]  # under each specification
    study = Path(readme).parent
    # a study still training may keep its finished runs' records with a README and no report yet
    owns = [json.loads(f.read_text()) for f in [study / "summary.json", *study.glob("*/summary.json")] if f.is_file()]
    holm = [c["p_holm"] for own in owns for c in own["comparisons"] + own["in_domain_comparisons"] + (own.get("interactions") or [])
            if c["p_holm"] is not None]
    bad = []
    for para in _hand_written(Path(readme)):
        for m in TRIPLE.finditer(para):
            if not any(all(_close(v, x) for v, x in zip(m.groups(), t)) for t in triples):
                bad.append(m.group(0))
        for m in HOLM.finditer(para):
            for v in [m.group(1), *re.findall(r"\d\.\d+|1", m.group(2))]:
                if not any(_close(v, x) for x in holm):
                    bad.append(m.group(0))
    assert not bad, f"{readme}: quoted numbers not in summary.json: {bad}"


def test_a_superseding_study_answers_its_claims_once_published(tmp_path):
    """Once the study with the comparison design is published with a claim's runs, the claim is computed there and
    the superseded study's estimate stays beside it; claims whose runs it lacks stay with the old study."""
    root = tmp_path / "repo"
    shutil.copytree(ROOT / "experiments", root / "experiments")
    (root / "results").mkdir()
    for s in ("architectures", "architectures_shared_lr"):
        shutil.copytree(ROOT / "results" / s, root / "results" / s, ignore=shutil.ignore_patterns("*.png", "*.html"))
    before = {r["id"]: r for r in build_scorecard(root)["claims"]}
    assert before["mamba2_worse"]["results"] == "architectures" and before["mamba2_worse"]["before"] is None
    # stand-in for the published annealed study: the same records under its name (its claims' runs are all there
    # except mamba2_lr2e-3)
    shutil.copytree(root / "results" / "architectures", root / "results" / "architectures_annealed")
    rows = {r["id"]: r for r in build_scorecard(root)["claims"]}
    m2 = rows["mamba2_worse"]
    assert (m2["study"], m2["results"]) == ("architectures_annealed", "architectures_annealed")
    assert m2["before"]["study"] == "architectures" and m2["before"]["mean"] == pytest.approx(before["mamba2_worse"]["test"]["mean"])
    with pytest.raises(ConfigError, match="superseding_runs"):
        load_claims(_claims(tmp_path, lambda t: t.replace('mamba2 = "mamba2_lr2e-3"', 'mamba2 = "mamba9"', 1)), ROOT)


def test_a_superseding_study_not_published_is_named_in_the_rows_that_wait_for_it(tmp_path, card):
    """Until the rerun that supersedes a study is published with a claim's runs, the claim stays with the old study
    and its row says which rerun will answer it and how far that rerun is published (not silently the old one)."""
    assert next(r for r in card["claims"] if r["id"] == "mamba2_worse")["pending"] is None
    root = tmp_path / "repo"
    shutil.copytree(ROOT / "experiments", root / "experiments")
    (root / "results").mkdir()
    src = ROOT / "results" / "ablation_position"
    shutil.copytree(src, root / "results" / "ablation_position", ignore=shutil.ignore_patterns("*.png", "*.html"))
    row = next(r for r in build_scorecard(root)["claims"] if r["id"] == "position_alibi_hurts")  # the rerun not there
    assert row["results"] == "ablation_position" and row["pending"]["study"] == "ablation_position_1k"
    assert not row["pending"]["published"] and row["pending"]["size"] == "small-1k"
    # stand-in for a rerun published in part: the same records without ALiBi's
    shutil.copytree(src, root / "results" / "ablation_position_1k", ignore=shutil.ignore_patterns("*.png", "*.html", "pos_alibi-s*"))
    rows = {r["id"]: r for r in build_scorecard(root)["claims"]}
    assert rows["position_none"]["results"] == "ablation_position_1k" and rows["position_none"]["pending"] is None
    alibi = rows["position_alibi_hurts"]
    assert alibi["results"] == "ablation_position" and alibi["pending"]["published"] and alibi["pending"]["lacking"] == ["pos_alibi"]
    text = scorecard_markdown(build_scorecard(root))
    assert "published in part, results/ablation_position_1k/ has no records of pos_alibi yet" in text


def test_a_study_published_in_part_leaves_its_other_claims_not_run(tmp_path):
    """A study whose runs are not all trained yet may be published in part: the claims it has every run of are
    answered, the others stay "not run" and say what is missing (not an error)."""
    root = tmp_path / "repo"
    shutil.copytree(ROOT / "experiments", root / "experiments")
    (root / "results").mkdir()
    src = ROOT / "results" / "ablation_temperature"
    shutil.copytree(src, root / "results" / "ablation_temperature", ignore=shutil.ignore_patterns("*.png", "*.html", "temp_4.0-s*"))
    card = build_scorecard(root)
    row = next(r for r in card["claims"] if r["id"] == "sharper_softmax_helps")
    assert row["verdict"] == "not run" and row["results"] is None
    assert row["detail"].startswith("results/ablation_temperature/ is published in part: no records of temp_4.0 yet")
    assert row["scale"] is not None
    # the README's Results section lists it as published in part, not among the studies not run
    text = readme_results(card, root)
    assert "Published in part, some claims still waiting for their runs: `ablation_temperature`." in text
    assert "`ablation_temperature`" not in next(line for line in text.splitlines() if line.startswith("Not run yet"))


VERDICT_WORD = re.compile(r"\*\*(holds|fails|undecided)\*\*")


@pytest.mark.parametrize("readme", sorted(glob.glob(str(ROOT / "results/*/README.md"))), ids=lambda p: Path(p).parent.name)
def test_study_readmes_state_verdicts_only_as_the_scorecard_does(readme, card):
    """A verdict word in a study README's hand-written text (bold holds / fails / undecided) agrees with scorecard.json:
    with the claim it names in backticks, or else with a claim the study answers (or, in a `basecap compare` folder, with
    its row's verdict); "does not hold" is not a verdict the
    scorecard gives (it says fails or undecided)."""
    study = Path(readme).parent.name
    verdicts = {r["id"]: r["verdict"] for r in card["claims"]}
    own = {r["verdict"] for r in card["claims"] if r["results"] == study}
    row = Path(readme).parent / "compare.json"  # a `basecap compare` folder: its row's verdict over the arms
    if row.is_file():
        own.add(json.loads(row.read_text())["overall"]["verdict"])
    bad = []
    for para in _hand_written(Path(readme)):
        if para.startswith("|"):  # a table of the study's own report (its own Holm), not a verdict of the project
            continue
        if "does not hold" in para:
            bad.append(para[:120])
        for sentence in re.split(r"(?<=\.)\s", para):
            words = VERDICT_WORD.findall(sentence)
            ids = [i for i in re.findall(r"`([a-z0-9_]+)`", sentence) if i in verdicts]
            for w in words:
                if (ids and w not in {verdicts[i] for i in ids}) or (not ids and w not in own):
                    bad.append(sentence[:160])
    assert not bad, f"{readme}: verdict words that disagree with the scorecard: {bad}"


def test_gap_along_training_agrees_with_the_band(card):
    """The gap along training of a pair claim, read at the band's middle, is close to the band's mean gap (the
    primary estimate), and every level with an interval has at least 2 seeds."""
    row = next(r for r in card["claims"] if r["id"] == "mamba2_worse")
    g = row["gap_along_training"]
    mid = next(p for p in g["points"] if abs(p["level"] - 4.1) < 1e-9)
    assert mid["n"] == 5 and abs(mid["mean"] - row["test"]["mean"]) < 0.02
    assert all(p["n"] >= 2 for p in g["points"] if p["ci95"])
    assert [p["level"] for p in g["points"]] == sorted(p["level"] for p in g["points"])
    assert next(r for r in card["claims"] if r["id"] == "sharper_softmax_helps").get("gap_along_training") is None  # a trend
