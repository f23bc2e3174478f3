"""``basecap leaderboard`` over made-up records: one row per architecture (the scorecard's architecture claims,
Transformer++ and every ``basecap compare`` result), its columns read from the right files, sorted on request."""

import json

import pytest

from basecap.cli import main
from basecap.config_base import ConfigError
from basecap.leaderboard import build_rows, leaderboard_markdown, sort_rows, write_leaderboard


def _run(root, study, name, mixer, tokens_per_s):
    d = root / "results" / study / "runs" / f"{name}-s0"
    d.mkdir(parents=True)
    model = {"vocab_size": 64, "d_model": 32, "n_layers": 2, "max_seq_len": 64, "mixer": mixer}
    info = {
        "config": {"name": name, "model": model},
        "params": {"total": 2_500_000, "non_embedding": 1_000_000},
        "speed": {"tokens_per_s": tokens_per_s},
        "device": {"type": "cpu", "threads": 1},
    }
    (d / "run.json").write_text(json.dumps(info))


def _claim(cid, run, reference="transformer_pp", **kw):
    return {"id": cid, "run": run, "reference": reference, "expect": "worse", "metric": "ood_gap", "results": "st", "seeds": [0, 1], **kw}


@pytest.fixture
def root(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    parts = {"mamba1 vs transformer_pp": {"docs": {"0": 0.10, "1": 0.20}, "code": {"0": 0.30, "1": 0.50}}}
    arms = [
        {"label": "A: both at 2e-3", "test": {"mean": 0.15, "ci95": [0.05, 0.25]}},
        {"label": "B: both at 8e-3", "status": "waiting", "test": None},
    ]
    card = {
        "claims": [
            _claim("mamba1_worse", "mamba1", test={"mean": 0.275, "ci95": [0.1, 0.45]}, verdict="holds", parts=parts, arms=arms),
            _claim("mamba_vs_gdn", "mamba1", reference="gated_deltanet", test={"mean": 0.06}),  # not against Transformer++
            _claim("speed", "deltanet", metric="speed_ratio", expect="better"),  # not a loss gap
        ],
        "principle": {
            "points": [
                {"label": "Transformer++", "study": "st", "run": "transformer_pp", "reference": "transformer_pp", "mqar": {"mean": 0.9}},
                {"label": "Mamba-1", "study": "st", "run": "mamba1", "reference": "transformer_pp", "mqar": None},
            ]
        },
    }
    (results / "scorecard.json").write_text(json.dumps(card))
    (results / "st").mkdir()
    summary = {"runs": [{"name": "mamba1", "in_domain_loss": 4.1}, {"name": "transformer_pp", "in_domain_loss": 4.0}]}
    (results / "st" / "summary.json").write_text(json.dumps(summary))
    _run(tmp_path, "st", "mamba1", {"name": "mamba1"}, 1000.0)
    _run(tmp_path, "st", "transformer_pp", {"name": "attention", "head_dim": 8}, 3000.0)
    _run(tmp_path, "compare-dn-st", "dn", {"name": "deltanet", "head_dim": 8}, 2000.0)
    row = {
        "architecture": "dn",
        "study": "st",
        "arms": [
            {
                "arm": "tuned",
                "n": 3,
                "gap": -0.01,
                "ci95": [-0.05, 0.03],
                "domains": {"docs": {"gap": -0.02, "ci95": None}, "code": {"gap": 0.0, "ci95": None}},
            },
            {"arm": "A", "n": 3, "gap": 0.02, "ci95": [-0.01, 0.05]},
        ],
        "overall": {"verdict": "keeps"},
        "mqar": {"mean": 0.5},
        "state_bytes": 4096,
        "state_grows": False,
        "cost": "O(T) train, O(1) per decoded token",
    }
    (results / "compare-dn-st" / "compare.json").write_text(json.dumps(row))
    return tmp_path


def test_one_row_per_architecture_from_the_right_files(root):
    rows = {r["label"]: r for r in build_rows(root)}
    assert set(rows) == {"Transformer++", "Mamba-1", "dn"}
    m = rows["Mamba-1"]
    assert (m["gap"], m["gap_ci"], m["verdict"], m["arm_a"], m["arm_b_note"]) == (0.275, [0.1, 0.45], "holds", 0.15, "waiting")
    assert m["docs"] == pytest.approx(0.15) and m["code"] == pytest.approx(0.40) and m["code_ci"][0] < 0.40 < m["code_ci"][1]
    assert (m["in_domain_loss"], m["tokens_per_s"], m["threads"], m["params"]) == (4.1, 1000.0, [1], 2_500_000)
    assert m["state_grows"] is False and m["cost"] == "O(T) train, O(1) per decoded token" and m.get("mqar") is None
    t = rows["Transformer++"]
    assert (t["gap"], t["mqar"], t["state_grows"], t["cost"]) == (0.0, 0.9, True, "O(T^2) train, O(T) per decoded token")
    d = rows["dn"]
    assert (d["gap"], d["arm_a"], d["verdict"], d["mqar"], d["state_bytes"], d["study"]) == (-0.01, 0.02, "keeps", 0.5, 4096, "compare-dn-st")


def test_sorted_by_any_column(root):
    rows = build_rows(root)
    assert [r["label"] for r in sort_rows(rows, "gap")] == ["dn", "Transformer++", "Mamba-1"]
    assert [r["label"] for r in sort_rows(rows, "mqar")] == ["Transformer++", "dn", "Mamba-1"]  # best first, unmeasured last
    assert [r["label"] for r in sort_rows(rows, "speed")] == ["Transformer++", "dn", "Mamba-1"]
    with pytest.raises(ConfigError, match="--sort: unknown column 'nope'"):
        sort_rows(rows, "nope")


def test_the_page_and_its_figure(root, capsys):
    text = leaderboard_markdown(build_rows(root))
    assert "| Mamba-1 | 2.50M (1.00M) | 4.100 | +0.275 [+0.100, +0.450] | +0.150 [" in text
    assert "*waiting*" in text and "[compare-dn-st](compare-dn-st/)" in text
    assert "`principle_mqar_vs_gap.png`, `basecap scorecard --figures`) is not yet drawn" in text
    (root / "results" / "principle_mqar_vs_gap.png").write_bytes(b"png")
    assert main(["leaderboard", "--root", str(root), "--sort", "mqar"]) == 0
    page = (root / "results" / "LEADERBOARD.md").read_text()
    assert "![selection ability against OOD gap](principle_mqar_vs_gap.png)" in page and "Rows sorted by mqar" in page
    assert page.index("| Transformer++ |") < page.index("| dn |") < page.index("| Mamba-1 |")
    assert write_leaderboard(root) == root / "results" / "LEADERBOARD.md"
    with pytest.raises(SystemExit):
        main(["leaderboard", "--sort", "nope"])
