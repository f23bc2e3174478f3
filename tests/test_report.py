import json

import numpy as np
import pytest

from basecap.report import load_run, matched_gap, report


def fake_run(root, name, seed, offset, weights=None, steps=10, x_shift=0.0):
    d = root / f"{name}-s{seed}"
    d.mkdir(parents=True)
    weights = weights or {"prose": 1.0}
    info = {"run_id": f"{name}-s{seed}", "config": {"name": name, "seed": seed, "data": {"train_weights": weights},
            "model": {"mixer": {"name": name}}}, "params": {"total": 1000, "non_embedding": 800, "embedding": 200}}
    (d / "run.json").write_text(json.dumps(info))
    lines = []
    for i, x in enumerate(np.linspace(5.0, 3.0, steps) + x_shift):
        lines.append({"kind": "train", "step": i + 1, "loss": float(x)})
        doms = {"prose": {"loss": float(x), "bpb": float(x) / 2}, "code": {"loss": float(x + offset), "bpb": float(x + offset) / 2}}
        lines.append({"kind": "eval", "step": i + 1, "in_domain_loss": float(x), "domains": doms})
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return d


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
    assert summary["gaps"]["worse"]["code"]["significant"] is True
    assert summary["gaps"]["worse"]["code"]["mean_gap"] == pytest.approx(0.405, abs=1e-6)
    assert summary["gaps"]["same"]["code"]["significant"] is False
    assert "| worse | ref | code |" in text
    assert "data:image/png;base64" in (tmp_path / "rep" / "report.html").read_text()


def test_mixed_control_compares_within_its_own_setting(tmp_path):
    mixed = {"prose": 0.5, "code": 0.5}
    dirs = [fake_run(tmp_path, "tpp_limited", 0, 1.0), fake_run(tmp_path, "m_limited", 0, 1.3),
            fake_run(tmp_path, "tpp_mixed", 0, 0.2, mixed), fake_run(tmp_path, "m_mixed", 0, 0.2, mixed)]
    # same architecture in both settings: give the mixed runs the reference's model config
    for d in dirs[2:3]:
        info = json.loads((d / "run.json").read_text())
        info["config"]["model"] = {"mixer": {"name": "tpp_limited"}}
        (d / "run.json").write_text(json.dumps(info))
    report(dirs, tmp_path / "rep", reference="tpp_limited")
    gaps = json.loads((tmp_path / "rep" / "summary.json").read_text())["gaps"]
    assert gaps["m_limited"]["code"]["against"] == "tpp_limited"
    assert gaps["m_mixed"]["code"]["against"] == "tpp_mixed"
    assert gaps["m_mixed"]["code"]["mean_gap"] == pytest.approx(0.0, abs=1e-9)
    assert gaps["m_mixed"]["code"]["in_domain_here"] is True


def test_bad_metrics_line_is_named(tmp_path):
    d = fake_run(tmp_path, "ref", 0, 1.0)
    with open(d / "metrics.jsonl", "a") as f:
        f.write("{oops\n")
    with pytest.raises(ValueError, match=r"metrics.jsonl:21: not valid JSON"):
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
