"""Scale steps of the scorecard: a claim's gap again at a larger size, outside the family (validation, the
measured / in-part / not-run states, Welch's difference against the textbook formula, the generated text)."""

import math
import shutil
from pathlib import Path

import pytest
from scipy import stats

from basecap.config_base import ConfigError
from basecap.scorecard import build_scorecard, load_claims
from basecap.scorecard.render_claims import scorecard_markdown
from basecap.scorecard.render_readme import readme_results, study_block
from basecap.scorecard.scale import reading, welch

ROOT = Path(__file__).resolve().parents[1]


def _repo(tmp_path, studies=("architectures_annealed",)):
    root = tmp_path / "repo"
    shutil.copytree(ROOT / "experiments", root / "experiments")
    (root / "results").mkdir()
    for s in studies:
        shutil.copytree(ROOT / "results" / s, root / "results" / s, ignore=shutil.ignore_patterns("*.png", "*.html"))
    return root


def _edit(root, old, new):
    p = root / "experiments/paper/claims.toml"
    text = p.read_text()
    assert old in text
    p.write_text(text.replace(old, new))


def test_a_scale_step_is_validated_like_a_claim(tmp_path):
    root = _repo(tmp_path, ())
    step = '[[scale_steps]]\nclaim = "mamba2_worse"\nstudy = "architectures_annealed_4x"'
    _edit(root, step, step.replace("mamba2_worse", "mamba9_worse"))
    with pytest.raises(ConfigError, match="scale_steps\\[0\\]: unknown claim 'mamba9_worse'"):
        load_claims(root / "experiments/paper/claims.toml", root)
    _edit(root, step.replace("mamba2_worse", "mamba9_worse"), step.replace("architectures_annealed_4x", "architectures_annealed"))
    with pytest.raises(ConfigError, match="a study a claim of the family uses"):
        load_claims(root / "experiments/paper/claims.toml", root)
    # a step whose study's experiment file lacks the claim's runs
    _edit(root, step.replace("architectures_annealed_4x", "architectures_annealed"), step.replace("architectures_annealed_4x", "temperature_4x"))
    _edit(
        root, "[studies.fewshot_1p3b]", '[studies.temperature_4x]\nexperiment = "ablation_temperature.toml"\nsize = "small"\n[studies.fewshot_1p3b]'
    )
    with pytest.raises(
        ConfigError, match="scale_steps\\[0\\] \\(mamba2_worse\\): 'mamba2', 'transformer_pp' is not a run of ablation_temperature.toml"
    ):
        load_claims(root / "experiments/paper/claims.toml", root)


def test_a_scale_step_not_run_in_part_and_measured(tmp_path):
    root = _repo(tmp_path)
    card = build_scorecard(root)
    (step,) = _steps(card)
    assert step["status"] == "not run" and step["test"] is None and step["scale"]["context"] == 256
    assert step["base"]["test"]["mean"] == pytest.approx(next(r for r in card["claims"] if r["id"] == "mamba2_worse")["test"]["mean"])
    assert card["family_size"] == build_scorecard(root)["family_size"]  # the step is outside the family
    # finished runs archived before the study is reported: still not run, and the row names them
    kept = root / "results/architectures_annealed_4x/runs"
    shutil.copytree(root / "results/architectures_annealed/runs/transformer_pp-s0", kept / "transformer_pp-s0")
    (step,) = _steps(build_scorecard(root))
    assert step["status"] == "not run" and step["kept"] == ["transformer_pp-s0"]
    assert step["detail"].endswith("; finished runs kept in results/architectures_annealed_4x/runs/: transformer_pp-s0")
    shutil.rmtree(kept.parent)
    # published in part: only the reference's records
    src, dst = root / "results/architectures_annealed", root / "results/architectures_annealed_4x"
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("mamba*", "gated*", "top1*"))
    (step,) = _steps(build_scorecard(root))
    assert step["status"] == "in part" and step["lacking"] == ["mamba2"]
    assert "published in part: no records of mamba2 yet" in scorecard_markdown(build_scorecard(root))
    # measured: a stand-in with the small study's own records, so the gap is the claim's and the difference 0
    shutil.rmtree(dst)
    shutil.copytree(src, dst)
    card = build_scorecard(root)
    (step,) = _steps(card)
    row = next(r for r in card["claims"] if r["id"] == "mamba2_worse")
    assert step["status"] == "measured" and step["results"] == "architectures_annealed_4x"
    assert step["values"] == pytest.approx(row["values"]) and step["test"]["ci95"] == pytest.approx(row["test"]["ci95"])
    assert step["difference"]["mean"] == pytest.approx(0, abs=1e-12) and step["difference"]["ci95"][0] < 0 < step["difference"]["ci95"][1]
    assert step["reading"] == "the 95% interval above 0: the paper's direction"
    text = scorecard_markdown(card)
    assert "## Scale steps (outside the family)" in text and "minus the small gap: +0.000" in text
    block = study_block(card, "architectures_annealed_4x")
    assert "Scale steps outside the family" in block and "| `mamba2_worse` | small-4x |" in block
    assert "| `mamba2_worse` | small to small-4x | mamba2 against transformer_pp | +0.202 [+0.161, +0.242] (5) | +0.202" in readme_results(card, root)
    # the same step at each size's lowest common level and at half of training: with the same records at both
    # sizes, both readings agree and their differences are 0
    assert [lv["level"] for lv in step["levels"]] == ["lowest", "half"]
    for lv in step["levels"]:
        assert lv["step"]["band"] == lv["base"]["band"] and lv["step"]["values"] == pytest.approx(lv["base"]["values"])
        assert lv["difference"]["mean"] == pytest.approx(0, abs=1e-12)
    assert "| `mamba2_worse` | small to small-4x | lowest common level |" in text


BASE_STEP = """
[[scale_steps]]
claim = "mamba2_worse"
study = "architectures_annealed_4x"
base = "annealed_base"
run = "mamba2"
reference = "transformer_pp"
why = "a step set against another study at the smaller size."
"""


def test_a_step_set_against_a_base_study_at_the_smaller_size(tmp_path):
    """A step with `base`: the smaller size's gap is the step's runs in the base study, not the claim's own row; while
    the base is not published the step says so and has no difference."""
    root = _repo(tmp_path)
    _edit(root, "[studies.fewshot_1p3b]", '[studies.annealed_base]\nexperiment = "architectures_annealed.toml"\nsize = "small"\nresults = "annealed_base"\n[studies.fewshot_1p3b]')
    p = root / "experiments/paper/claims.toml"
    p.write_text(p.read_text() + BASE_STEP)
    src = root / "results/architectures_annealed"
    shutil.copytree(src, root / "results/architectures_annealed_4x")
    card = build_scorecard(root)
    (step,) = [s for s in card["scale_steps"] if s["base"]["study"] == "annealed_base"]
    assert step["status"] == "measured" and step["difference"] is None and not step["base"]["seeds"]
    assert "`mamba2` against `transformer_pp` at the smaller size: results/annealed_base/ not published yet" in scorecard_markdown(card)
    shutil.copytree(src, root / "results/annealed_base")
    card = build_scorecard(root)
    (step,) = [s for s in card["scale_steps"] if s["base"]["study"] == "annealed_base"]
    row = next(r for r in card["claims"] if r["id"] == "mamba2_worse")
    assert step["base"]["own"] is False and step["base"]["results"] == "annealed_base"
    assert step["base"]["test"]["mean"] == pytest.approx(row["test"]["mean"]) and step["difference"]["mean"] == pytest.approx(0, abs=1e-12)
    assert [lv["difference"]["mean"] for lv in step["levels"]] == pytest.approx([0, 0], abs=1e-12)
    assert "| `mamba2` against `transformer_pp` at the smaller size |" in scorecard_markdown(card)
    assert "Scale steps outside the family" in study_block(card, "annealed_base")


@pytest.mark.parametrize(
    "edit, message",
    [
        (('run = "mamba2"\n', ""), "give run and reference together"),
        (('base = "annealed_base"', 'base = "architectures_annealed_4x"'), "base: the step study itself"),
        (('base = "annealed_base"', 'base = "nowhere"'), "base: unknown study 'nowhere'"),
        (('run = "mamba2"\nreference = "transformer_pp"\n', ""), "needs the runs it compares"),
        (('run = "mamba2"', 'run = "mamba3"'), "scale_steps\\[\\d+\\]( base)? \\(mamba2_worse\\): 'mamba3' is not a run"),
    ],
)
def test_a_base_study_is_validated(tmp_path, edit, message):
    root = _repo(tmp_path, ())
    _edit(root, "[studies.fewshot_1p3b]", '[studies.annealed_base]\nexperiment = "architectures_annealed.toml"\nsize = "small"\n[studies.fewshot_1p3b]')
    p = root / "experiments/paper/claims.toml"
    p.write_text(p.read_text() + BASE_STEP.replace(*edit))
    with pytest.raises(ConfigError, match=message):
        load_claims(p, root)


def _steps(card, study="architectures_annealed_4x"):
    return [s for s in card["scale_steps"] if s["study"] == study]


def test_welch_matches_the_textbook_formula():
    a, b = [1.0, 2.0, 3.0, 4.0], [2.0, 4.0, 6.0]
    va, vb = stats.tvar(a) / len(a), stats.tvar(b) / len(b)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))  # Welch-Satterthwaite
    diff = sum(a) / 4 - sum(b) / 3
    half = stats.t.ppf(0.975, df) * math.sqrt(va + vb)
    w = welch(a, b)
    assert w["mean"] == pytest.approx(diff) and w["df"] == pytest.approx(df)
    assert w["ci95"] == pytest.approx([diff - half, diff + half])
    assert w["p"] == pytest.approx(2 * stats.t.sf(abs(diff) / math.sqrt(va + vb), df))
    assert welch([1.0], b) is None


def test_reading_words():
    assert reading({"ci95": [0.1, 0.3]}, 1) == "the 95% interval above 0: the paper's direction"
    assert reading({"ci95": [-0.3, -0.1]}, 1) == "the 95% interval below 0: against the paper"
    assert reading({"ci95": [-0.1, 0.3]}, 1) == "the 95% interval includes 0"
    assert reading({"ci95": None}, 1) == "too few seeds for an interval"


def test_direction_of_a_step():
    from basecap.scorecard.scale import direction

    assert direction({"ci95": [0.01, 0.2]}, 0.05) == "grows"
    assert direction({"ci95": [-0.2, -0.01]}, 0.05) == "shrinks"
    assert direction({"ci95": [-0.04, 0.03]}, 0.05) == "holds"
    assert direction({"ci95": [-0.04, 0.08]}, 0.05) == "not determined"
    assert direction(None, 0.05) == "not determined"


def test_trend_and_its_prediction_by_hand():
    """Per doubling: the Welch difference over the doublings; carried: gap_L + k (gap_L - gap_S) with the variance
    of that combination and Welch-Satterthwaite degrees of freedom."""
    from basecap.scorecard.scale import trend

    large, small = [0.30, 0.25, 0.28], [0.20, 0.18, 0.22, 0.21, 0.19]
    entry = {
        "values": large,
        "difference": welch(large, small),
        "scale": {"params_non_embedding": 4_000_000, "train_tokens": 8_000_000},
        "base": {"scale": {"params_non_embedding": 1_000_000, "train_tokens": 2_000_000}},
    }
    target = {"label": "110m", "params_non_embedding": 64_000_000, "train_tokens": 10**10}
    t = trend(entry, small, target)
    assert t["grows"] == "parameters" and t["doublings"] == pytest.approx(2.0)
    assert t["per_doubling"]["mean"] == pytest.approx(entry["difference"]["mean"] / 2)
    k = 4 / 2  # 4 doublings from 4M to 64M over the step's 2
    ml, ms = sum(large) / 3, sum(small) / 5
    va, vb = stats.tvar(large) / 3, stats.tvar(small) / 5
    var = (1 + k) ** 2 * va + k**2 * vb
    df = var**2 / (((1 + k) ** 2 * va) ** 2 / 2 + (k**2 * vb) ** 2 / 4)
    p = t["prediction"]
    assert p["mean"] == pytest.approx((1 + k) * ml - k * ms) and p["df"] == pytest.approx(df)
    assert p["ci95"][1] - p["mean"] == pytest.approx(stats.t.ppf(0.975, df) * math.sqrt(var))
    assert p["tokens_on_path"] == pytest.approx(8_000_000 * 16)
    # a token step (the width held): a change per doubling of tokens, no prediction in parameters
    entry["scale"] = {"params_non_embedding": 1_000_000, "train_tokens": 8_000_000}
    t = trend(entry, small, target)
    assert t["grows"] == "tokens" and t["prediction"] is None


def test_scaling_file_reads_a_measured_step(tmp_path):
    from basecap.scorecard.render_scaling import scaling_markdown

    root = _repo(tmp_path)
    shutil.copytree(root / "results/architectures_annealed", root / "results/architectures_annealed_4x")
    text = scaling_markdown(build_scorecard(root))
    assert "| Mamba (Mamba-2), each at its rate tuned at small | small to small-4x | mamba2 against transformer_pp |" in text
    # the same records at both sizes: a difference of 0 inside the margin at every reading
    assert "**holds** +0.000" in text and "| yes |" in text
    assert "nothing to carry" in text and "No size step is measured yet." in text
    assert "## Not measured yet" in text and "Mamba (Mamba-2), small to small-long" in text
