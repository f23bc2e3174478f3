import json
import subprocess
import sys

import pytest

from basecap.cli import build_parser, main


def write_exp(tmp_path, recipe, extra=""):
    p = tmp_path / "exp.toml"
    p.write_text(f"""
name = "smoke"
out_dir = "{tmp_path / 'runs'}"
reference = "tpp"
[data]
recipe = "{recipe}"
train_weights = {{prose = 1.0}}
seq_len = 32
[model]
d_model = 32
n_layers = 2
max_seq_len = 32
[train]
steps = 6
batch_size = 4
warmup_steps = 1
checkpoint_every = 3
progress = false
[eval]
every = 3
max_tokens = 1024
batch_size = 4
[[runs]]
name = "tpp"
model.mixer = {{name = "attention", head_dim = 8}}
[[runs]]
name = "abs"
model.mixer = {{name = "attention", head_dim = 8, position = "absolute"}}
{extra}
""")
    return p


def test_every_subcommand_has_help(capsys):
    for cmd in (["data", "build"], ["train", "x"], ["eval", "x"], ["report", "x"], ["run", "x"], ["mixers"], ["bench", "train"]):
        with pytest.raises(SystemExit) as e:
            build_parser().parse_args([cmd[0], "--help"])
        assert e.value.code == 0
    assert "examples:" in build_parser().format_help()


def test_choices_come_from_the_registries(capsys):
    from basecap.eval.suites import suite_names
    from basecap.presets import PRESETS

    p = build_parser()
    assert [p.parse_args(["eval", "x", "--suite", s]).suite for s in suite_names()] == suite_names()
    assert [p.parse_args(["mixers", "--preset", name]).preset for name in PRESETS] == list(PRESETS)
    with pytest.raises(SystemExit):
        p.parse_args(["eval", "x", "--suite", "nope"])
    assert "choose from " + ", ".join(map(repr, ["loss", *suite_names()])) in capsys.readouterr().err


def test_parsing_imports_no_registry():
    code = ("import sys; from basecap.cli import build_parser; build_parser().parse_args(['eval', 'x']); "
            "build_parser().parse_args(['mixers']); print(sorted(m for m in ('torch', 'basecap.eval.suites') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_run_train_eval_report_end_to_end(tiny_recipe_path, tmp_path, capsys):
    exp = write_exp(tmp_path, tiny_recipe_path)
    assert main(["run", str(exp)]) == 0
    out = capsys.readouterr().out
    assert "report:" in out and "| abs |" in out
    runs = tmp_path / "runs"
    assert (runs / "report" / "report.html").exists()
    assert json.loads((runs / "tpp-s0" / "eval.json").read_text())["split"] == "test"
    # a second run skips finished runs
    assert main(["run", str(exp)]) == 0
    assert "already finished" in capsys.readouterr().out
    assert main(["eval", str(runs / "abs-s0"), "--split", "validation"]) == 0
    assert "(OOD)" in capsys.readouterr().out
    assert main(["report", str(runs / "tpp-s0"), str(runs / "abs-s0"), "--out", str(tmp_path / "rep")]) == 0
    assert (tmp_path / "rep" / "report.md").exists()


def test_config_errors_exit_2_with_the_key(tiny_recipe_path, tmp_path, capsys):
    exp = write_exp(tmp_path, tiny_recipe_path)
    assert main(["run", str(exp), "--set", "train.stepz=3"]) == 2
    assert "train.stepz: unknown key" in capsys.readouterr().err
    assert main(["train", str(exp), "--run", "nope"]) == 2
    assert "unknown run(s) ['nope']" in capsys.readouterr().err
    assert main(["run", str(exp), "--set", "data.train_weights={poetry=1.0}"]) == 2
    assert "unknown domain(s) ['poetry']" in capsys.readouterr().err
    assert main(["eval", str(tmp_path / "nothing")]) == 2


def test_experiment_suites_and_speed_reach_the_report(tiny_recipe_path, tmp_path, capsys):
    extra = """
[[suites]]
suite = "mqar"
d_models = [16]
n_layers = 1
steps = 10
batch_size = 8
num_test = 16
seed = 0
[speed]
lengths = [16]
contexts = [16]
reps = 1
"""
    exp = write_exp(tmp_path, tiny_recipe_path, extra).read_text().replace("seeds", "seeds")
    p = tmp_path / "exp2.toml"
    p.write_text(exp.replace('reference = "tpp"', 'reference = "tpp"\nseeds = [0, 1]'))
    assert main(["run", str(p)]) == 0
    text = (tmp_path / "runs" / "report" / "report.md").read_text()
    assert "## Associative recall: mqar" in text and "## Speed against sequence length" in text
    runs = tmp_path / "runs"
    # with a fixed seed the from-scratch MQAR result is computed once per architecture and reused
    assert (runs / "tpp-s1" / "eval_mqar.json").read_bytes() == (runs / "tpp-s0" / "eval_mqar.json").read_bytes()
    # an unchanged experiment reuses the stored result; a changed suite option recomputes it
    speed = runs / "speed" / "mixers.json"
    before = (runs / "tpp-s0" / "eval_mqar.json").stat().st_mtime_ns, speed.stat().st_mtime_ns
    assert main(["run", str(p)]) == 0
    assert ((runs / "tpp-s0" / "eval_mqar.json").stat().st_mtime_ns, speed.stat().st_mtime_ns) == before
    p.write_text(p.read_text().replace("steps = 10", "steps = 12").replace("lengths = [16]", "lengths = [16, 24]"))
    assert main(["run", str(p)]) == 0
    for s in ("s0", "s1"):
        assert json.loads((runs / f"tpp-{s}" / "eval_mqar.json").read_text())["options"]["steps"] == 12
    assert json.loads(speed.read_text())["meta"]["grid"]["lengths"] == [16, 24]


def test_archive_keeps_finished_runs_records_and_refuses_unfinished_ones(tmp_path, capsys):
    """`basecap archive` copies what `report --archive` copies (records, metrics compressed, no checkpoints), without a
    report; a run without done.json is an error naming it, and then nothing is copied."""
    from tests.test_report import fake_run

    done = fake_run(tmp_path / "study", "ref", 0, 1.0, done=True)
    (done / "checkpoints" / "step_10").mkdir(parents=True)
    training = fake_run(tmp_path / "study", "ssm", 0, 1.3)
    out = tmp_path / "results"
    assert main(["archive", str(done), str(training), "--out", str(out)]) == 2
    assert str(training) in capsys.readouterr().err and not out.exists()
    assert main(["archive", str(done), "--out", str(out)]) == 0
    kept = sorted(p.name for p in (out / "runs" / "ref-s0").iterdir())
    assert kept == ["done.json", "metrics.jsonl.zst", "run.json"]
    assert main(["archive", str(tmp_path / "nothing"), "--out", str(out)]) == 2
