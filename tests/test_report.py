import json
import zlib
from html.parser import HTMLParser

import numpy as np
import pytest

from basecap.report import load_run, matched_gap, report
from basecap.report.baselines import run_unigram


def fake_run(root, name, seed, offset, weights=None, steps=10, x_shift=0.0, unigram=None, windows=0, info_extra=None, done=False):
    """A run folder whose in-domain loss falls linearly from 5 to 3 (+ x_shift) and whose code loss is that
    + offset. ``unigram``: per-domain baseline losses recorded in the evaluations; ``windows``: number of
    per-window losses recorded (around each loss, seeded by the run); ``done``: finished (a done.json)."""
    d = root / f"{name}-s{seed}"
    d.mkdir(parents=True)
    weights = weights or {"prose": 1.0}
    info = {"run_id": f"{name}-s{seed}", "config": {"name": name, "seed": seed, "data": {"train_weights": weights},
            "model": {"mixer": {"name": name}}}, "params": {"total": 1000, "non_embedding": 800, "embedding": 200},
            "git_commit": "abc123", "git_dirty": False, **(info_extra or {})}
    (d / "run.json").write_text(json.dumps(info))
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    lines = []
    for i, x in enumerate(np.linspace(5.0, 3.0, steps) + x_shift):
        lines.append({"kind": "train", "step": i + 1, "loss": float(x)})
        doms = {"prose": {"loss": float(x), "bpb": float(x) / 2}, "code": {"loss": float(x + offset), "bpb": float(x + offset) / 2}}
        for dom, res in doms.items():
            if unigram:
                res["unigram_loss"] = unigram[dom]
            if windows:
                noise = rng.normal(0, 0.3, windows)
                res["window_losses"] = (res["loss"] + noise - noise.mean()).tolist()
        lines.append({"kind": "eval", "step": i + 1, "in_domain_loss": float(x), "domains": doms})
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    if done:
        (d / "done.json").write_text(json.dumps({"steps": steps, "final": {}}))
    return d


def comparison(summary, run, domain="code"):
    return next(c for c in summary["comparisons"] if c["run"] == run and c["domain"] == domain)


def test_matched_gap_recovers_known_offset(tmp_path):
    a = load_run(fake_run(tmp_path, "ref", 0, 1.0))
    b = load_run(fake_run(tmp_path, "other", 0, 1.5, x_shift=0.3))  # different pace, same curve shape
    g = matched_gap(b, a, "code")
    assert g["mean_gap"] == pytest.approx(0.5, abs=1e-9)
    assert g["end_gap"] == pytest.approx(0.5, abs=1e-9)
    assert g["matched_range"] == pytest.approx([3.3, 5.0])


def test_report_writes_files_and_verdicts(tmp_path):
    dirs = [fake_run(tmp_path, "ref", s, 1.0) for s in (0, 1)]
    dirs += [fake_run(tmp_path, "worse", s, 1.4 + 0.01 * s) for s in (0, 1)]
    dirs += [fake_run(tmp_path, "same", s, 1.0 + (0.02 if s else -0.02)) for s in (0, 1)]
    md = report(dirs, tmp_path / "rep", reference="ref")
    text = md.read_text()
    for f in ("report.md", "report.html", "summary.json", "training_curves.png", "indomain_vs_ood.png"):
        assert (tmp_path / "rep" / f).exists()
    summary = json.loads((tmp_path / "rep" / "summary.json").read_text())
    worse, same = comparison(summary, "worse"), comparison(summary, "same")
    assert worse["verdict"] == "worse OOD" and worse["reference"] == "ref" and worse["n_seeds"] == 2
    assert worse["mean_gap"] == pytest.approx(0.405, abs=1e-6) and worse["per_seed"] == pytest.approx([0.40, 0.41])
    assert worse["p"] == pytest.approx(0.0079, abs=1e-4) and worse["p_holm"] == pytest.approx(2 * worse["p"])
    # per comparison: the uncorrected 95% interval; in the words, the simultaneous one (2 tests: level 97.5%)
    assert same["ci95"] == pytest.approx([-0.254, 0.254], abs=1e-3)
    assert same["verdict"] == "no detectable difference (simultaneous CI [-0.509, 0.509])"
    assert "| worse | ref | code | 2 | 0.405 [" in text and "| worse OOD |" in text
    assert "significant" not in text and "Holm" in text
    assert "data:image/png;base64" in (tmp_path / "rep" / "report.html").read_text()


def test_mixed_control_compares_within_its_own_setting(tmp_path):
    mixed = {"prose": 0.5, "code": 0.5}
    dirs = [fake_run(tmp_path, "tpp_limited", s, 1.0) for s in (0, 1)]
    dirs += [fake_run(tmp_path, "m_limited", s, 1.3 + 0.01 * s) for s in (0, 1)]
    dirs += [fake_run(tmp_path, "tpp_mixed", s, 0.2, mixed) for s in (0, 1)]
    dirs += [fake_run(tmp_path, "m_mixed", s, 0.2 + 0.01 * s, mixed) for s in (0, 1)]
    # same architecture in both settings: give the mixed runs the reference's model config
    for d in dirs[4:6]:
        info = json.loads((d / "run.json").read_text())
        info["config"]["model"] = {"mixer": {"name": "tpp_limited"}}
        (d / "run.json").write_text(json.dumps(info))
    report(dirs, tmp_path / "rep", reference="tpp_limited")
    summary = json.loads((tmp_path / "rep" / "summary.json").read_text())
    limited, control = comparison(summary, "m_limited"), comparison(summary, "m_mixed")
    assert limited["reference"] == "tpp_limited" and control["reference"] == "tpp_mixed"
    assert control["mean_gap"] == pytest.approx(0.005, abs=1e-9) and control["in_domain_here"] is True
    assert limited["in_domain_here"] is False
    # two Holm families of one comparison each: no correction across them
    assert limited["p_holm"] == pytest.approx(limited["p"]) and control["p_holm"] == pytest.approx(control["p"])
    # in-domain: each run against the reference architecture of its own setting, never a run against itself
    ind = {c["run"]: c for c in summary["in_domain_comparisons"]}
    assert set(ind) == {"m_limited", "m_mixed"}
    assert ind["m_limited"]["reference"] == "tpp_limited" and ind["m_mixed"]["reference"] == "tpp_mixed"


def test_bad_metrics_line_is_named(tmp_path):
    d = fake_run(tmp_path, "ref", 0, 1.0)
    lines = (d / "metrics.jsonl").read_text().splitlines()
    (d / "metrics.jsonl").write_text("\n".join(lines[:5] + ["{oops"] + lines[5:]) + "\n")
    with pytest.raises(ValueError, match=r"metrics.jsonl:6: not valid JSON"):
        load_run(d)


def test_suite_results_and_speed_appear_in_the_report(tmp_path):
    dirs = [fake_run(tmp_path, n, s, off) for n, off in (("ref", 1.0), ("ssm", 1.3)) for s in (0, 1)]
    for i, d in enumerate(dirs):
        ref = d.name.startswith("ref")
        acc = {"1": 1.0, "4": 0.9} if ref else {"1": 0.8, "4": 0.3}
        # ref: MQAR trained with each run's seed; ssm: a fixed MQAR seed, one result copied to both runs
        mq = {"suite": "mqar", "runs": [{"d_model": 64, "acc": acc, "mean_acc": sum(acc.values()) / 2, "state_bytes": 4096,
                                         "seed": i if ref else 0}]}
        if ref:  # a width sweep: a second point on ref's curve
            mq["runs"].append({"d_model": 32, "acc": {"1": 0.5, "4": 0.1}, "mean_acc": 0.3, "state_bytes": 2048, "seed": i})
        (d / "eval_mqar.json").write_text(json.dumps(mq))
        (d / "suite_zeroshot").mkdir()
        (d / "suite_zeroshot" / "eval_lm-eval.json").write_text(json.dumps(
            {"suite": "lm-eval", "summary": {"arc_easy": {"acc": 0.3, "acc_norm": 0.35}}}))
    speed = tmp_path / "speed.json"
    speed.write_text(json.dumps({"meta": {"d_model": 192, "threads": 1}, "results": {
        "attention": {"ok": True, "train_s": {"512": 0.1}, "decode_ms": {"1024": 1.0}},
        "ssm": {"ok": True, "train_s": {"512": 0.05}, "decode_ms": {"1024": 0.5}}}}))
    text = report(dirs, tmp_path / "rep", reference="ref", speed_json=speed).read_text()
    assert "## Associative recall: mqar" in text and "| ssm | 64 | 1 | 4,096 | 0.80 | 0.30 | 0.550 |" in text
    assert "| ref | 64 | 2 | 4,096 | 1.00 ± 0.00 | 0.90 ± 0.00 | 0.950 ± 0.000 |" in text
    assert "| ref | 32 | 2 | 2,048 | 0.50 ± 0.00 | 0.10 ± 0.00 | 0.300 ± 0.000 |" in text
    assert "## lm-evaluation-harness: lm-eval (zeroshot)" in text and "0.350 ± 0.000" in text
    assert "## Speed against sequence length" in text and "0.050 (0.50x)" in text
    assert (tmp_path / "rep" / "recall_vs_state_mqar.png").exists()


def test_summary_json_for_a_program(tmp_path):
    exp = tmp_path / "study"
    exp.mkdir()
    (exp / "experiment.json").write_text(json.dumps({"name": "architectures", "size": "small"}))
    uni = {"prose": 6.9, "code": 8.6}
    dirs = [fake_run(exp, n, s, off + 0.01 * s, unigram=uni, windows=64) for n, off in (("ref", 1.0), ("ssm", 1.3)) for s in range(3)]
    text = report(dirs, tmp_path / "rep", reference="ref").read_text()
    summary = json.loads((tmp_path / "rep" / "summary.json").read_text())
    assert (summary["study"], summary["size"], summary["commit"]) == ("architectures", "small", "abc123")
    ssm = next(r for r in summary["runs"] if r["name"] == "ssm")
    assert ssm["seeds"] == [0, 1, 2] and ssm["in_domain_loss"] == pytest.approx(3.0)
    assert ssm["unigram_loss"] == pytest.approx(6.9) and ssm["context_gain"] == pytest.approx(3.9)
    assert ssm["ood"] == {"code": pytest.approx(4.31)}
    c = comparison(summary, "ssm")
    assert {"run", "reference", "domain", "n_seeds", "per_seed", "mean_gap", "ci95", "p", "p_holm", "verdict"} <= set(c)
    assert c["n_seeds"] == 3 and c["per_seed"] == pytest.approx([0.3, 0.3, 0.3]) and c["verdict"] == "worse OOD"
    assert c["ci95"] == pytest.approx([0.3, 0.3]) and c["eval_se"] > 0 and c["dominant_noise"] == "evaluation"
    assert summary["near_unigram"] == [] and "Near unigram" not in text
    assert "| ssm | 0.00M (0.00M) | 10 | 3.000 ± 0.000 | 3.900 ± 0.000 |" in text
    assert "| unigram (prose) | - | - | 6.900 | 0 | 6.900 | 8.600 |" in text


def test_near_unigram_study_is_marked_above_the_verdicts(tmp_path):
    dirs = [fake_run(tmp_path, n, s, off, unigram={"prose": 3.5, "code": 5.0}) for n, off in (("ref", 1.0), ("ssm", 1.3)) for s in (0, 1)]
    text = report(dirs, tmp_path / "rep", reference="ref").read_text()
    mark = text.index("Near unigram: OOD differences here are not about base capability")
    assert mark < text.index("## OOD gap against") and "Every run gains less than 1 nat" in text
    assert json.loads((tmp_path / "rep" / "summary.json").read_text())["near_unigram"] == ["ref", "ssm"]
    assert "class='warn'" in (tmp_path / "rep" / "report.html").read_text()


def test_runs_without_a_baseline_still_report(tmp_path):
    dirs = [fake_run(tmp_path, n, 0, off) for n, off in (("ref", 1.0), ("ssm", 1.3))]
    text = report(dirs, tmp_path / "rep", reference="ref").read_text()
    summary = json.loads((tmp_path / "rep" / "summary.json").read_text())
    assert [r["unigram_loss"] for r in summary["runs"]] == [None, None] and summary["near_unigram"] == []
    assert comparison(summary, "ssm")["verdict"] == "too few seeds" and "| ssm | 0.00M (0.00M) | 10 | 3.000 | - |" in text


def test_old_runs_get_their_baseline_from_the_corpus(tmp_path, tiny_corpus):
    from basecap.data.baselines import unigram_losses

    cfg = {"data": {"seq_len": 32}, "eval": {"split": "validation", "max_tokens": 256}}
    d = fake_run(tmp_path, "ref", 0, 1.0, info_extra={"corpus": {"dir": tiny_corpus.dir.name}})
    info = json.loads((d / "run.json").read_text())
    info["config"].update(cfg | {"data": {**cfg["data"], **info["config"]["data"]}})
    (d / "run.json").write_text(json.dumps(info))
    assert run_unigram(load_run(d)) == pytest.approx(unigram_losses(tiny_corpus, {"prose": 1.0}, ["prose", "code"], "validation", 32, 256))
    info["corpus"]["dir"] = "not-built-here"
    (d / "run.json").write_text(json.dumps(info))
    assert run_unigram(load_run(d)) is None


class _Page(HTMLParser):
    """The tags, attributes and text of an HTML page, as a browser's parser reads them."""

    def __init__(self, text: str):
        super().__init__()
        self.tags, self.attrs, self.text = [], [], []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs += attrs

    def handle_data(self, data):
        self.text.append(data)


def test_html_escapes_every_name_and_loads_nothing(tmp_path):
    img, script, bold = "<img src=x onerror=alert(1)>", "<script>alert(1)</script>", "<b onmouseover=alert(2)>code</b>"
    dirs = [fake_run(tmp_path, n, s, off) for n, off in (("ref", 1.0), (img, 1.3)) for s in (0, 1)]
    for d in dirs:  # a held-out domain, a suite and a task named with markup, read back from the run folders
        lines = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
        for rec in lines:
            if rec["kind"] == "eval":
                rec["domains"][bold] = rec["domains"].pop("code")
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
        (d / "suite_x").mkdir()
        (d / "suite_x" / "eval_mqar.json").write_text(json.dumps({"suite": "mqar" + script, "runs": [
            {"d_model": 8, "acc": {"1": 0.5}, "mean_acc": 0.5, "state_bytes": 10, "seed": 0}]}))
        (d / "eval_lm-eval.json").write_text(json.dumps({"suite": "lm-eval", "summary": {script: {"acc": 0.3}}}))
    speed = tmp_path / "speed.json"
    speed.write_text(json.dumps({"meta": {"d_model": 8, "threads": 1}, "results": {
        script: {"ok": True, "train_s": {"512": 0.1}, "decode_ms": {"1024": 1.0}}}}))
    tuning = tmp_path / "tuning.json"
    tuning.write_text(json.dumps({"keys": ["train.lr"], "seeds": [100], "runs": {img: {
        "tried": [{"name": img + "@lr=1", "values": {"train.lr": script}, "losses": {"100": 3.0}, "mean": 3.0}],
        "chosen": {"train.lr": script}, "chosen_name": img + "@lr=1"}}}))
    report(dirs, tmp_path / "rep", reference="ref", speed_json=speed, tuning_json=tuning)
    html = (tmp_path / "rep" / "report.html").read_text()
    page = _Page(html)
    assert "script" not in page.tags and set(page.tags) <= {"html", "head", "meta", "title", "style", "body", "h1", "h2", "p",
                                                           "table", "tr", "th", "td", "strong", "code", "img"}
    assert not [name for name, _ in page.attrs if name.startswith("on")]
    sources = [value for name, value in page.attrs if name in ("src", "href")]
    assert sources and all(v.startswith("data:image/png;base64,") for v in sources)  # no external URL
    assert page.tags.count("img") == len(list((tmp_path / "rep").glob("*.png")))
    text = "".join(page.text)
    for name in (img, script, bold):
        assert name in text and html.count(name) == 0  # shown as text, never as markup
    assert "&lt;img src=x onerror=alert(1)&gt;" in html
    assert [p.name for p in (tmp_path / "rep").glob("recall_vs_state_*")] == ["recall_vs_state_mqar_script_alert_1_script_x.png"]


def test_markdown_inline_spans_become_text_spans():
    from basecap.report.page import blocks, inline

    assert inline("a **<b>** and `x<y`") == [("text", "a "), ("strong", "<b>"), ("text", " and "), ("code", "x<y")]
    got = blocks("# T <i>\n\n| a | **b** |\n|---|---|\n| 1 | <2> |\n![p](p.png)\n> **warn** x\ntext")
    assert [b["kind"] for b in got] == ["heading", "table", "warn", "para"]
    assert got[1]["head"] == [[("text", "a")], [("strong", "b")]] and got[1]["rows"] == [[[("text", "1")], [("text", "<2>")]]]


def test_an_archived_report_is_written_again_from_the_results_folder_alone(tmp_path):
    """report(archive=True) keeps each run's records (no checkpoints) and the study's experiment.json under
    OUT/runs/; a report over OUT/runs/* then gives the same summary.json and report.md, even with the
    original run folders gone."""
    import shutil

    exp = tmp_path / "study"
    exp.mkdir()
    (exp / "experiment.json").write_text(json.dumps({"name": "architectures", "size": "small"}))
    dirs = [fake_run(exp, n, s, off + 0.01 * s, unigram={"prose": 6.9, "code": 8.6}, windows=16)
            for n, off in (("ref", 1.0), ("ssm", 1.3)) for s in range(3)]
    (dirs[0] / "checkpoints" / "step_10").mkdir(parents=True)
    (dirs[0] / "checkpoints" / "step_10" / "model.safetensors").write_bytes(b"x" * 100)
    (dirs[0] / "eval.json").write_text(json.dumps({"split": "test"}))
    (dirs[0] / "eval_mqar.json").write_text(json.dumps({"suite": "mqar", "runs": []}))
    out = tmp_path / "results"
    report(dirs, out, reference="ref", archive=True)
    first_md, first = (out / "report.md").read_text(), json.loads((out / "summary.json").read_text())
    kept = sorted(str(p.relative_to(out / "runs")) for p in (out / "runs").rglob("*") if p.is_file())
    assert "ref-s0/eval.json" in kept and "ref-s0/eval_mqar.json" in kept and "experiment.json" in kept
    assert "ssm-s2/metrics.jsonl.zst" in kept and "ssm-s2/metrics.jsonl" not in kept and "ssm-s2/run.json" in kept and not any("checkpoints" in k for k in kept)
    shutil.rmtree(exp)
    report(sorted((out / "runs").glob("*-s*")), out, reference="ref", archive=True)
    assert json.loads((out / "summary.json").read_text()) == first
    assert (out / "report.md").read_text() == first_md


def test_archived_run_records_under_results_are_not_git_ignored():
    """`runs/` is ignored (checkpoints), but a published study's records in results/<study>/runs/ must be
    committed, or the results folder cannot be re-rendered nor reused on a fresh checkout."""
    import shutil
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("not a git checkout")

    def ignored(path: str) -> bool:
        return subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=root).returncode == 0

    assert ignored("runs/quickstart/transformer_pp-s0/run.json")
    assert not ignored("results/some_study/runs/transformer_pp-s0/metrics.jsonl")
    assert not ignored("results/some_study/runs/experiment.json")


def test_in_domain_difference_at_the_end_of_training_is_paired_by_seed(tmp_path):
    """Runs that end at a higher in-domain loss than the reference (x_shift) get that difference, paired by
    seed, with its interval and a Holm correction of its own; a run whose final step differs is left out."""
    dirs = [fake_run(tmp_path, "ref", s, 1.0) for s in range(3)]
    dirs += [fake_run(tmp_path, "slow", s, 1.0, x_shift=0.3 + 0.01 * s) for s in range(3)]
    dirs += [fake_run(tmp_path, "same", s, 1.0, x_shift=(-0.01, 0.0, 0.01)[s]) for s in range(3)]
    dirs += [fake_run(tmp_path, "short", 0, 1.0, steps=8)]
    text = report(dirs, tmp_path / "rep", reference="ref").read_text()
    summary = json.loads((tmp_path / "rep" / "summary.json").read_text())
    comps = {c["run"]: c for c in summary["in_domain_comparisons"]}
    assert set(comps) == {"slow", "same", "short"}
    slow, same, short = comps["slow"], comps["same"], comps["short"]
    assert slow["per_seed"] == pytest.approx([0.30, 0.31, 0.32]) and slow["mean_diff"] == pytest.approx(0.31)
    assert slow["ci95"] == pytest.approx([0.31 - 4.303 * 0.01 / 3 ** 0.5, 0.31 + 4.303 * 0.01 / 3 ** 0.5], abs=1e-4)
    assert slow["p"] < 0.001 and slow["p_holm"] == pytest.approx(2 * slow["p"])  # 2 tests: short has none
    assert same["mean_diff"] == pytest.approx(0.0, abs=1e-12) and same["p"] == pytest.approx(1.0)
    assert short["n_seeds"] == 0 and short["p_holm"] is None and "different steps" in short["notes"][0]
    assert "## In-domain loss against `ref` at the end of training" in text and "| slow | ref | 3 | +0.310 [" in text


def test_plot_legends_name_each_run_once():
    """Seeds share a colour, so a panel's legend lists run names (with their seed count), not every seed's curve,
    on the first curve drawn of each name (whichever seed that is)."""
    from collections import Counter
    from pathlib import Path

    from basecap.report.plots import legend_label
    from basecap.report.runs import Run

    runs = [Run(Path("."), f"{n}-s{s}", n, s, {}) for n, seeds in (("a", (0, 1, 2)), ("b", (0,))) for s in seeds]
    seeds = Counter(r.name for r in runs)
    labelled: set[str] = set()
    assert [legend_label(r, seeds, labelled) for r in runs] == ["a (3 seeds)", "_nolegend_", "_nolegend_", "b-s0"]
    labelled = set()  # a panel where a-s0 has no curve: a-s1 carries the name
    assert [legend_label(r, seeds, labelled) for r in runs[1:]] == ["a (3 seeds)", "_nolegend_", "b-s0"]


def test_bands_print_as_written():
    from basecap.report.design_page import band_text

    assert [band_text(b) for b in ([4.0, 4.2], [4.8, 5.0], [4.25, 4.45], [4.125, 5])] == ["4.0-4.2", "4.8-5.0", "4.25-4.45", "4.125-5.0"]
