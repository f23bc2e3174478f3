"""The form of a published study (docs/experiments.md, "Publishing a study"): report.html in a results folder refers to
the PNGs beside it while one in a runs/ folder embeds them; kept records are compact JSON that reads back to exactly
the same floats, done.json no longer repeats the final evaluation, and records in the earlier (indented, whole
done.json) form still read and report alike."""

import json
import math
import struct
from html.parser import HTMLParser

import numpy as np
import pytest

from basecap.cli import main
from basecap.report import load_run, report
from basecap.report.core import is_published
from basecap.rundir import RunDir
from tests.test_report import fake_run


class _Images(HTMLParser):
    def __init__(self, html):
        super().__init__()
        self.src = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.src.append(dict(attrs)["src"])


def images(folder):
    return _Images((folder / "report.html").read_text()).src


def study(root, n_seeds=2):
    """A finished study's folder as `basecap run` leaves it: its runs and experiment.json (its name and size)."""
    dirs = [fake_run(root, name, s, off, windows=8, done=True) for name, off in (("ref", 1.0), ("ssm", 1.3)) for s in range(n_seeds)]
    (root / "experiment.json").write_text(json.dumps({"name": "s", "size": "small"}))
    return dirs


def test_a_runs_folder_report_embeds_its_figures_and_a_published_one_links_them(tmp_path):
    dirs = study(tmp_path / "runs" / "s-small")
    report(dirs, tmp_path / "runs" / "s-small" / "report", reference="ref")
    embedded = images(tmp_path / "runs" / "s-small" / "report")
    assert embedded and all(s.startswith("data:image/png;base64,") for s in embedded)

    out = tmp_path / "results" / "s"
    report(dirs, out, reference="ref", archive=True)
    linked = images(out)
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert sorted(linked) == pngs and len(linked) == len(embedded)  # the same figures, each a file beside the page
    assert not any(":" in s or "/" in s for s in linked)  # relative names: no scheme, no other folder
    assert (out / "report.html").stat().st_size < 20_000  # no figure stored twice

    # written again from its own archive (no --archive): still linked, the same page and numbers
    first = {f: (out / f).read_bytes() for f in ("report.md", "report.html", "summary.json")}
    kept = [out / "runs" / d.name for d in dirs]
    assert is_published(out, kept) and is_published(out / "second", kept) and not is_published(out / "runs" / "x", kept)
    report(kept, out, reference="ref")
    assert {f: (out / f).read_bytes() for f in first} == first
    # a second report beside the study, written from the study's records: linked too
    report(kept, out / "second", reference="ref")
    assert all(not s.startswith("data:") and (out / "second" / s).is_file() for s in images(out / "second"))
    # the same records reported elsewhere, or with an explicit choice
    report(kept, tmp_path / "elsewhere", reference="ref")
    assert all(s.startswith("data:") for s in images(tmp_path / "elsewhere"))
    report(kept, out, reference="ref", embed_images=True)
    assert all(s.startswith("data:") for s in images(out))
    report(dirs, tmp_path / "runs" / "s-small" / "report", reference="ref", embed_images=False)
    assert sorted(images(tmp_path / "runs" / "s-small" / "report")) == pngs


def test_a_study_whose_runs_folder_is_named_runs_still_embeds(tmp_path):
    """An experiment with out_dir = "runs": its runs are runs/<run>, its report runs/report, not a results folder."""
    dirs = study(tmp_path / "runs")
    report(dirs, tmp_path / "runs" / "report", reference="ref")
    assert all(s.startswith("data:") for s in images(tmp_path / "runs" / "report"))


def test_cli_embed_flags(tmp_path, capsys):
    dirs = [str(d) for d in study(tmp_path / "st")]
    assert main(["report", *dirs, "--out", str(tmp_path / "a"), "--reference", "ref", "--no-embed-images"]) == 0
    assert not any(s.startswith("data:") for s in images(tmp_path / "a"))
    assert main(["report", *dirs, "--out", str(tmp_path / "b"), "--reference", "ref", "--archive", "--embed-images"]) == 0
    assert all(s.startswith("data:") for s in images(tmp_path / "b"))
    assert main(["report", *dirs, "--out", str(tmp_path / "c"), "--reference", "ref", "--archive"]) == 0
    assert not any(s.startswith("data:") for s in images(tmp_path / "c"))


def _bits(obj):
    """Every float of ``obj`` as its 64 bits, in order (NaN-safe exact comparison)."""
    if isinstance(obj, float):
        return [struct.pack("<d", obj)]
    if isinstance(obj, dict):
        return [k for k in obj] + [b for v in obj.values() for b in _bits(v)]
    if isinstance(obj, list):
        return [b for v in obj for b in _bits(v)]
    return [obj]


def awkward_floats(n=64):
    rng = np.random.default_rng(0)
    return [*rng.normal(4, 1, n).tolist(), *[round(v, 6) for v in rng.normal(4, 1, n).tolist()],
            0.1 + 0.2, 1e-300, 5e-324, -0.0, 1.7976931348623157e308, 2.0**-1074 * 3, math.nan, math.inf, -math.inf]


def old_form_run(root, name="ref", seed=0, awkward=True):
    """A finished run as kept before 2026-12-05: indented eval.json and suite result, done.json repeating the final
    evaluation record of metrics.jsonl whole. ``awkward``: its last evaluation's window losses are awkward floats."""
    d = fake_run(root, name, seed, 1.0 if name == "ref" else 1.3, windows=8)
    rd = RunDir(d)
    lines = rd.read_metrics()
    last = lines[-1]
    if awkward:
        last["domains"]["prose"]["window_losses"] = awkward_floats()
        rd.metrics_path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    (d / "done.json").write_text(json.dumps({"steps": last["step"], "final": last}, indent=1))
    ev = {"run_id": f"{name}-s{seed}", "split": "test", "in_domain_loss": 3.0000000000000004,
          "domains": {"prose": {"loss": 1 / 3, "window_losses": awkward_floats()}}}
    (d / "eval.json").write_text(json.dumps(ev, indent=1))
    (d / "eval_mqar.json").write_text(json.dumps({"suite": "mqar", "results": [{"acc": 2 / 3, "d_model": 8}]}, indent=1))
    return d, last, ev


def test_kept_records_are_compact_and_read_back_to_the_same_floats(tmp_path):
    d, last, ev = old_form_run(tmp_path / "study")
    written = RunDir(d).copy_records(tmp_path / "kept" / d.name)
    kept = RunDir(tmp_path / "kept" / d.name)
    assert sorted(p.name for p in written) == ["done.json", "eval.json", "eval_mqar.json", "metrics.jsonl.zst", "run.json"]
    for f in ("eval.json", "eval_mqar.json", "done.json"):
        text = (kept.path / f).read_text()
        assert "\n" not in text and ", " not in text and ": " not in text  # no indentation, no spaces
        old = json.loads((d / f).read_text())
        if f != "done.json":
            assert _bits(json.loads(text)) == _bits(old)  # every float the same 64 bits
    done = kept.read_done()
    assert done["steps"] == last["step"] and "domains" not in done["final"]
    assert _bits(done["final"]) == _bits({k: v for k, v in last.items() if k != "domains"})
    assert _bits(kept.final_eval()) == _bits(last)  # the whole record, from the kept metrics
    assert _bits(kept.read_metrics()) == _bits(RunDir(d).read_metrics())
    # the same form in place (basecap archive --compact), and once compact nothing changes again
    assert sorted(p.name for p in RunDir(d).compact_records()) == ["done.json", "eval.json", "eval_mqar.json", "metrics.jsonl.zst"]
    for f in ("done.json", "eval.json", "eval_mqar.json", "metrics.jsonl.zst", "run.json"):
        assert (d / f).read_bytes() == (kept.path / f).read_bytes(), f
    assert RunDir(d).compact_records() == []


def test_records_in_the_earlier_form_still_read_and_report_alike(tmp_path):
    old = [old_form_run(tmp_path / "old" / "study", name, s, awkward=False)[0] for name in ("ref", "ssm") for s in (0, 1)]
    rd = RunDir(old[0])
    assert "domains" in rd.read_done()["final"] and _bits(rd.final_eval()) == _bits(rd.read_done()["final"])
    report(old, tmp_path / "from_old", reference="ref")
    new = tmp_path / "new" / "study"  # the study's name is its folder's
    for d in old:
        RunDir(d).copy_records(new / d.name)
    report([new / d.name for d in old], tmp_path / "from_new", reference="ref")
    for f in ("report.md", "summary.json"):
        assert (tmp_path / "from_old" / f).read_bytes() == (tmp_path / "from_new" / f).read_bytes(), f
    assert [r.evals for r in map(load_run, old)] == [load_run(new / d.name).evals for d in old]


def test_a_done_json_whose_record_is_missing_from_the_metrics_is_kept_whole(tmp_path):
    d, last, _ = old_form_run(tmp_path)
    rd = RunDir(d)
    rd.metrics_path.write_text("".join(json.dumps(r) + "\n" for r in rd.read_metrics()[:-2]))  # the final record lost
    assert rd.short_done(rd.read_done()) == rd.read_done()  # nothing dropped that is held nowhere else
    RunDir(d).compact_records()
    assert _bits(RunDir(d).final_eval()) == _bits(last)
    rd.done_path.write_text(json.dumps({"steps": last["step"], "final": {"kind": "eval", "step": last["step"]}}))
    with pytest.raises(ValueError, match="final evaluation"):
        rd.final_eval()


def test_archive_compact_rewrites_kept_records_in_place(tmp_path, capsys):
    d, last, _ = old_form_run(tmp_path / "results" / "s" / "runs")
    assert main(["archive", str(d)]) == 2 and main(["archive", str(d), "--out", str(tmp_path), "--compact"]) == 2
    assert main(["archive", str(d), "--compact"]) == 0
    assert "rewrote 4 records of 1 runs" in capsys.readouterr().out
    assert "\n" not in (d / "eval.json").read_text() and not (d / "metrics.jsonl").exists()
    assert _bits(RunDir(d).final_eval()) == _bits(last)


def test_archive_refuses_two_runs_of_one_name(tmp_path):
    """Two studies' runs of the same name (a size's reused copy beside another size's run) would land in one folder,
    the second over the first: refused, both named."""
    from basecap.config_base import ConfigError
    from basecap.report.core import archive_runs

    a, _, _ = old_form_run(tmp_path / "runs" / "study-small")
    b, _, _ = old_form_run(tmp_path / "runs" / "study-small-4x")
    assert a.name == b.name
    with pytest.raises(ConfigError, match=rf"archive: .*study-small/{a.name} and .*study-small-4x/{a.name} are both run {a.name}"):
        archive_runs([a, b], tmp_path / "results" / "study")
    assert not (tmp_path / "results" / "study" / "runs" / a.name).exists()
