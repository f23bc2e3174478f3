import json
import os
import re
from pathlib import Path

import pytest
import torch

from basecap.config_base import ConfigError
from basecap.model import LM
from basecap.plan import GPUS, format_plan, plan_experiment
from basecap.plan.gpu import MODEL_STATE_BYTES, RESERVE_GIB, activation_bytes_per_token

GiB = 2**30


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _write(tmp_path, text, name="exp.toml"):
    p = tmp_path / name
    p.write_text(text)
    return p


TINY = """
name = "tiny_plan"
seeds = [0, 1]
[data]
recipe = "{recipe}"
seq_len = 64
[model]
d_model = 32
n_layers = 2
max_seq_len = 64
[train]
steps = 100
batch_size = 16
warmup_steps = 5
[[runs]]
name = "tpp"
model.mixer = {{ name = "attention", head_dim = 8 }}
[[runs]]
name = "dn"
model.mixer = {{ name = "deltanet", head_dim = 8 }}
"""

PRESETS = """
name = "presets"
[data]
seq_len = 2048
[model]
vocab_size = 32000
[train]
batch_size = 256
steps = 5000
warmup_steps = 100
[[runs]]
name = "tpp_110m"
model.preset = "110m"
[[runs]]
name = "tpp_1.3b"
model.preset = "1.3b"
train.steps = 50000
"""


def test_tiny_experiment_numbers_match_the_model(tmp_path, tiny_recipe_path):
    rows = plan_experiment(_write(tmp_path, TINY.format(recipe=tiny_recipe_path)), gpus=2, gpu="H100")
    assert [r["run"] for r in rows] == ["tpp", "dn"] and all(r["seeds"] == 2 for r in rows)
    from basecap.config import load_experiment

    for rc, r in zip(load_experiment(_write(tmp_path, TINY.format(recipe=tiny_recipe_path))).resolve()[:2], rows):  # seed-major
        assert r["vocab_size"] == 384 and "recipe" in r["vocab_source"]  # the tiny recipe's tokenizer size
        model = LM(rc.model.model_copy(update={"vocab_size": 384}))  # a real (CPU) build agrees with the meta one
        counts = model.param_counts()
        assert (r["params_total"], r["params_non_embedding"]) == (counts["total"], counts["non_embedding"])
        assert r["fwd_flops_per_token"] == model.flops_per_token(64) and r["train_flops_per_token"] == 3 * r["fwd_flops_per_token"]
        assert r["tokens_per_step"] == 16 * 64 and r["total_tokens"] == 16 * 64 * 100 and r["micro_batch_per_gpu"] == 8
        assert r["gpu"] == "H100-80GB" and r["parallel"] == "ddp" and r["fits"] and not r["issues"]
        mem = r["memory_gib"]
        assert mem["model_states"] == pytest.approx(MODEL_STATE_BYTES * counts["total"] / GiB)
        act = activation_bytes_per_token(model, 64)
        assert mem["activations"] == pytest.approx(8 * 64 * (act["layers"] + act["head"]) / GiB)
        assert mem["total"] == pytest.approx(sum(v for k, v in mem.items() if k != "total"))
        secs = r["total_train_flops"] / (2 * GPUS["H100-80GB"]["tflops"] * 1e12 * 0.4)
        assert r["est_hours"] == pytest.approx(secs / 3600)
    # a constant-state mixer keeps chunk states on top of its projections; attention keeps none
    assert rows[1]["memory_gib"]["activations"] > 0 and rows[0]["issues"] == []


def test_presets_are_sane(tmp_path):
    rows = {r["run"]: r for r in plan_experiment(_write(tmp_path, PRESETS), gpus=8, gpu="H100-80GB")}
    small, big = rows["tpp_110m"], rows["tpp_1.3b"]
    assert 1.2e9 <= big["params_total"] <= 1.5e9 and 1.1e9 <= big["params_non_embedding"] <= big["params_total"]
    assert 0.1e9 <= small["params_total"] <= 0.16e9 and 70e6 <= small["params_non_embedding"] <= 0.1e9
    for r in (small, big):  # 6N-style: 3 x forward lies between 6 N_non-embedding and ~6 N_total (+ attention)
        assert 6 * r["params_non_embedding"] <= r["train_flops_per_token"] <= 1.2 * 6 * r["params_total"]
        assert r["tokens_per_step"] == 256 * 2048
    assert big["total_tokens"] == 256 * 2048 * 50000
    # ~26B tokens x 8.3 GFLOP/token at 40% of 8 x 989 TFLOP/s: a day, not a minute or a month
    assert 10 < big["est_hours"] < 40 and small["est_hours"] < big["est_hours"]


def test_memory_flagging_and_suggestions(tmp_path):
    path = _write(tmp_path, PRESETS)
    rows = {r["run"]: r for r in plan_experiment(path, gpus=8, gpu="L40S")}
    big = rows["tpp_1.3b"]
    assert big["gpu"] == "L40S-48GB" and not big["fits"] and big["memory_gib"]["total"] > 48
    assert any("does not fit" in i and "grad_accum" in i for i in big["issues"])
    # more accumulation shrinks only the activations; FSDP shards the model states
    acc = {r["run"]: r for r in plan_experiment(path, ["train.grad_accum=8"], gpus=8, gpu="L40S")}["tpp_1.3b"]
    assert acc["micro_batch_per_gpu"] == 4
    assert acc["memory_gib"]["activations"] == pytest.approx(big["memory_gib"]["activations"] / 8)
    assert acc["memory_gib"]["model_states"] == big["memory_gib"]["model_states"]
    fsdp = {r["run"]: r for r in plan_experiment(path, ["train.grad_accum=8"], gpus=8, gpu="L40S", parallel="fsdp")}["tpp_1.3b"]
    assert fsdp["memory_gib"]["model_states"] == pytest.approx(big["memory_gib"]["model_states"] / 8)
    assert fsdp["fits"] and fsdp["memory_gib"]["total"] < acc["memory_gib"]["total"]
    # a global batch the GPUs cannot split evenly is reported
    odd = plan_experiment(path, ["train.batch_size=250"], gpus=8)[0]
    assert any("not divisible" in i for i in odd["issues"])


def test_format_plan_text_and_json(tmp_path, tiny_recipe_path):
    rows = plan_experiment(_write(tmp_path, TINY.format(recipe=tiny_recipe_path)), gpus=1, gpu="A100-40GB", mfu=0.3)
    text = format_plan(rows)
    assert "1 x A100-40GB" in text and "MFU 0.30" in text and "tpp x2" in text and "dn x2" in text
    assert "yes" in text and f"+ {RESERVE_GIB:.1f} =" in text
    assert json.loads(format_plan(rows, as_json=True)) == json.loads(json.dumps(rows))


def test_bad_arguments_fail_with_a_clear_message(tmp_path, tiny_recipe_path):
    path = _write(tmp_path, TINY.format(recipe=tiny_recipe_path))
    with pytest.raises(ConfigError, match="unknown GPU"):
        plan_experiment(path, gpu="TPUv9")
    with pytest.raises(ConfigError, match="gpus"):
        plan_experiment(path, gpus=0)
    with pytest.raises(ConfigError, match="mfu"):
        plan_experiment(path, mfu=1.5)


def test_sweep_points_and_both_tune_phases_are_counted(tmp_path, tiny_recipe_path):
    sweep = TINY.format(recipe=tiny_recipe_path) + "[sweep]\ntrain.lr = [1e-3, 2e-3]\n"
    rows = plan_experiment(_write(tmp_path, sweep), gpus=1)
    assert [r["run"] for r in rows] == ["tpp@lr=0.001", "tpp@lr=0.002", "dn@lr=0.001", "dn@lr=0.002"]
    assert all(r["seeds"] == 2 and "phase" not in r for r in rows)
    rows = plan_experiment(_write(tmp_path, sweep + '[tune]\nkeys = ["train.lr"]\nseeds = [100]\n'), gpus=1)
    tuning, comparison = [r for r in rows if r["phase"] == "tuning"], [r for r in rows if r["phase"] == "comparison"]
    assert [r["run"] for r in tuning] == ["tpp@lr=0.001", "tpp@lr=0.002", "dn@lr=0.001", "dn@lr=0.002"]
    assert all(r["seeds"] == 1 for r in tuning) and [(r["run"], r["seeds"]) for r in comparison] == [("tpp", 2), ("dn", 2)]
    per_run = 16 * 64 * 100
    assert sum(r["total_tokens"] * r["seeds"] for r in tuning) == sum(r["total_tokens"] * r["seeds"] for r in comparison) == 4 * per_run
    text = format_plan(rows)
    assert "-- tuning phase (every value on the tuning seeds): 4 trainings, 410k tokens" in text
    assert "-- comparison phase (every run at its chosen values on the comparison seeds): 4 trainings, 410k tokens" in text
    assert "tpp@lr=0.001 " in text and "tpp x2" in text and not any(r["issues"] for r in rows)
    # a tuned key that changes the model: the comparison is sized at the first value, and says so
    deep = sweep.replace("train.lr = [1e-3, 2e-3]", "model.n_layers = [1, 2]") + '[tune]\nkeys = ["model.n_layers"]\nseeds = [100]\n'
    rows = plan_experiment(_write(tmp_path, deep), gpus=1)
    assert all(any("sized at the first tuned value" in i for i in r["issues"]) for r in rows if r["phase"] == "comparison")


def test_plan_columns_never_touch(tmp_path, tiny_recipe_path):
    """Every row splits into the header's columns on runs of 2+ spaces (no 'yes0.00092 s')."""
    sweep = TINY.format(recipe=tiny_recipe_path) + "[sweep]\ntrain.lr = [1e-3, 2e-3]\n[tune]\nkeys = [\"train.lr\"]\nseeds = [100]\n"
    text = format_plan(plan_experiment(_write(tmp_path, sweep), ["train.steps=1"], gpus=1))
    lines = text.splitlines()
    head = lines.index(next(line for line in lines if line.startswith("run ")))
    columns = re.split(r" {2,}", lines[head].strip())
    assert columns[-3:] == ["mem/GPU", "fits", "time"] and len(columns) == 12
    rows = [line for line in lines[head + 1:lines.index("", head)] if not line.startswith("-- ")]
    assert len(rows) == 6 and all(len(re.split(r" {2,}", row.strip())) == len(columns) for row in rows)
    assert all(re.search(r"  yes  +[0-9.e-]+ s$", row) for row in rows)


SIZED = TINY.replace('name = "tiny_plan"', 'name = "tiny_plan"\nsize = "tiny"') + """
[sizes.tiny]
train = {{ steps = 120, warmup_steps = 5 }}
[sizes.tiny.runs.dn]
train = {{ steps = 130 }}
"""


def test_set_wins_over_the_size_table(tmp_path, tiny_recipe_path):
    path = _write(tmp_path, SIZED.format(recipe=tiny_recipe_path))
    steps = {r["run"]: r["steps"] for r in plan_experiment(path, gpus=1)}
    assert steps == {"tpp": 120, "dn": 130}  # the size table (and its per-run entry) over the base
    rows = plan_experiment(path, ["train.steps=50"], gpus=1)
    assert {r["run"]: (r["steps"], r["total_tokens"]) for r in rows} == {"tpp": (50, 50 * 16 * 64), "dn": (50, 50 * 16 * 64)}
    with pytest.raises(ConfigError, match=r"--set train\.stepz: unknown key; train has: steps"):
        plan_experiment(path, ["train.stepz=50"], gpus=1)


def test_set_wins_in_the_paper_experiment():
    from basecap.config import load_experiment

    exp = load_experiment(Path(__file__).parents[1] / "experiments/paper/architectures.toml", ["train.steps=50"])
    assert exp.size is not None and exp.sizes[exp.size]["train"]["steps"] != 50
    assert {rc.train.steps for rc in exp.resolve()} == {50}


# ---- planning for this CPU ------------------------------------------------------------------------------------
CPU_PEAK = 100e9  # the peak stored for this CPU in the test's data home
PUB_PEAK = 50e9  # the peak the published run measured its MFU against
PUB_RATE = 5000.0  # the published run's median step rate


def _store_peak(home: Path, flops: float = CPU_PEAK, threads: int = 1):
    """A stored peak for this CPU, so the plan measures nothing."""
    from basecap.peak import cpu_model, store_key

    key = store_key(torch.device("cpu"), torch.float32, threads, cpu_model())
    entry = {"flops": flops, "median": flops, "wall_flops": flops, "products": 10, "stable": True, "size": 2048, "measured_at": "2026-12-05T00:00:00+00:00"}
    home.mkdir(parents=True, exist_ok=True)
    (home / "peak.json").write_text(json.dumps({key: entry}))


def _publish(results: Path, rc, vocab: int, tokens_per_s: float = PUB_RATE, peak: float = PUB_PEAK):
    """A published run of ``rc`` (its run.json as the trainer writes the fields the plan reads)."""
    model = LM(rc.model.model_copy(update={"vocab_size": vocab}))
    run = results / "study" / "runs" / rc.run_id
    run.mkdir(parents=True)
    info = {
        "run_id": rc.run_id,
        "config": json.loads(rc.model_dump_json()),
        "vocab_size": vocab,
        "flops_per_token": model.flops_per_token(rc.data.seq_len),
        "device": {"type": "cpu", "threads": 1, "cpu": "x86_64"},
        "peak_flops": {"per_device": peak, "source": "stored", "stored": "Some CPU (cpu, 1 thread(s)), float32"},
        "speed": {"steps": 99, "tokens_per_s": tokens_per_s},
    }
    (run / "run.json").write_text(json.dumps(info))
    return model


def test_cpu_plan_takes_published_rates_and_counts_evaluations(tmp_path, tiny_recipe_path):
    from basecap.config import load_experiment

    path = _write(tmp_path, TINY.format(recipe=tiny_recipe_path))
    home, results = tmp_path / "home", tmp_path / "results"
    _store_peak(home)
    tpp = next(rc for rc in load_experiment(path, ["train.threads=1"]).resolve() if rc.name == "tpp")
    tpp_model = _publish(results, tpp, 384)
    rows = {r["run"]: r for r in plan_experiment(path, ["train.threads=1"], results=[results], home=home)}
    r = rows["tpp"]
    assert r["device"] == "cpu" and r["threads"] == 1 and r["peak_flops"] == CPU_PEAK and r["rate_kind"] == "published"
    # the same model and shape: the published rate scaled by the two peaks
    assert r["tokens_per_s"] == pytest.approx(PUB_RATE * CPU_PEAK / PUB_PEAK)
    # evaluations: at steps 50 and 100 (eval.every 50), then the final test evaluation; the corpus is not built in this
    # home, so each covers both domains of the recipe at eval.max_tokens (65536 // 64 windows of 64 tokens)
    per_eval = 2 * (65536 // 64) * 64
    assert (r["evaluations"], r["eval_tokens"]) == (3, 3 * per_eval)
    seconds = 16 * 64 * 100 / r["tokens_per_s"] + 3 * per_eval / (3 * r["tokens_per_s"])  # a forward pass is 1/3 of a step
    assert r["est_hours"] * 3600 == pytest.approx(seconds) and r["train_seconds"] > 0 and r["eval_seconds"] > 0
    # no published run of DeltaNet: the published runs' MFU, named as such
    dn = rows["dn"]
    mfu = PUB_RATE * 3 * tpp_model.flops_per_token(64) / PUB_PEAK
    assert dn["rate_kind"] == "published-any" and dn["tokens_per_s"] == pytest.approx(mfu * CPU_PEAK / dn["train_flops_per_token"])
    assert "every published CPU run" in dn["rate_source"] and "this model and shape" in r["rate_source"]
    text = format_plan(list(rows.values()))
    assert "plan: this CPU" in text and "total:" in text and "on this CPU for 4 trainings" in text
    assert "published: MFU" in text and f"{CPU_PEAK / 1e9:.1f} GFLOP/s" in text
    assert json.loads(format_plan(list(rows.values()), as_json=True))[0]["rate_source"] == r["rate_source"]
    # --cpu-peak plans for another CPU: the rate follows the peak
    other = {x["run"]: x for x in plan_experiment(path, ["train.threads=1"], results=[results], home=home, cpu_peak=2 * CPU_PEAK)}
    assert other["tpp"]["tokens_per_s"] == pytest.approx(2 * r["tokens_per_s"]) and other["tpp"]["peak_source"].startswith("given")
    # --mfu on a CPU: that MFU x the stored peak
    given = plan_experiment(path, ["train.threads=1"], results=[results], home=home, mfu=0.25)[0]
    assert given["rate_kind"] == "given" and given["tokens_per_s"] == pytest.approx(0.25 * CPU_PEAK / given["train_flops_per_token"])


def test_cpu_plan_measures_when_nothing_is_published_and_stores_it(tmp_path, tiny_recipe_path, monkeypatch):
    import basecap.plan.cpu as pc

    path = _write(tmp_path, TINY.format(recipe=tiny_recipe_path))
    home = tmp_path / "home"
    _store_peak(home)
    monkeypatch.setattr(pc, "CALIBRATION_STEPS", 2)
    measured = []
    real = pc.measure_rate
    monkeypatch.setattr(pc, "measure_rate", lambda *a, **k: measured.append(a[0].name) or real(*a, warmup=1, steps=2))
    rows = plan_experiment(path, ["train.threads=1"], results=[], home=home)
    assert measured == ["tpp", "dn"] and all(r["rate_kind"] == "measured" and r["tokens_per_s"] > 0 and r["est_hours"] > 0 for r in rows)
    assert all("measured: this run's model and batch on this CPU" in r["rate_source"] for r in rows)
    stored = json.loads((home / "plan_rates.json").read_text())
    assert len(stored) == 2 and all(e["threads"] == 1 and e["tokens_per_s"] > 0 for e in stored.values())
    again = plan_experiment(path, ["train.threads=1"], results=[], home=home)  # stored: nothing measured again
    assert measured == ["tpp", "dn"] and [r["tokens_per_s"] for r in again] == [r["tokens_per_s"] for r in rows]


def test_cpu_plan_counts_the_built_corpus_windows(tmp_path, tiny_recipe_path, tiny_corpus):
    from basecap.data.loader import eval_windows

    from basecap.config import load_experiment
    from basecap.plan.cpu import evaluation_tokens

    path = _write(tmp_path, TINY.format(recipe=tiny_recipe_path))
    home = Path(os.environ["BASECAP_HOME"])  # where tiny_corpus is built
    rc = load_experiment(path).resolve()[0]
    ev = evaluation_tokens(rc, home)
    val = sum(len(eval_windows(tiny_corpus, d, "validation", 64, 65536)) * 64 for d in tiny_corpus.domains)
    test = sum(len(eval_windows(tiny_corpus, d, "test", 64, 65536)) * 64 for d in tiny_corpus.domains)
    # the tiny corpus's splits are shorter than eval.max_tokens: the windows they hold, not the cap
    assert (ev["eval_tokens_each"], ev["final_eval_tokens"], ev["eval_tokens"]) == (val, test, 2 * val + test) and val < 2 * 65536
    assert ev["eval_source"].startswith("corpus tiny")


def test_gpus_or_a_gpu_type_keep_the_gpu_plan(tmp_path, tiny_recipe_path, monkeypatch, capsys):
    from basecap.cli import main

    path = _write(tmp_path, TINY.format(recipe=tiny_recipe_path))
    assert plan_experiment(path, gpus=2)[0]["device"] == "gpu" and plan_experiment(path, gpus=2)[0]["gpu"] == "H100-80GB"
    only_type = plan_experiment(path, gpu="A100")[0]
    assert (only_type["gpus"], only_type["gpu"], only_type["mfu"]) == (8, "A100-80GB", 0.4)
    home = tmp_path / "home"
    _store_peak(home)
    monkeypatch.setenv("BASECAP_HOME", str(home))
    assert main(["plan", str(path), "--set", "train.threads=1", "--results", str(tmp_path / "none"), "--mfu", "0.3"]) == 0
    out = capsys.readouterr().out
    assert "plan: this CPU" in out and "given: MFU 0.300" in out and "GPU" not in out
    assert main(["plan", str(path), "--gpus", "2"]) == 0
    assert "plan: 2 x H100-80GB" in capsys.readouterr().out


def test_a_cuda_machine_plans_for_its_own_gpus(tmp_path, tiny_recipe_path, monkeypatch):
    path = _write(tmp_path, TINY.format(recipe=tiny_recipe_path))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "NVIDIA H100 80GB HBM3")
    r = plan_experiment(path)[0]
    assert (r["device"], r["gpus"], r["gpu"]) == ("gpu", 4, "H100-80GB")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "NVIDIA Quadro 9000")
    with pytest.raises(ConfigError, match="--gpu-type"):
        plan_experiment(path)


def test_cpu_plan_counts_the_smaller_curve_evaluations(tmp_path, tiny_recipe_path, tiny_corpus):
    """eval.curve_max_tokens: the main run's evaluations before its last step count at that size."""
    from basecap.config import load_experiment
    from basecap.plan.cpu import evaluation_tokens
    from basecap.plan.table import _evaluations_text, _n

    path = _write(tmp_path, TINY.format(recipe=tiny_recipe_path) + "[eval]\nevery = 25\ncurve_max_tokens = 128\n")
    home = Path(os.environ["BASECAP_HOME"])
    ev = evaluation_tokens(load_experiment(path).resolve()[0], home)
    curve = 2 * 64 * len(tiny_corpus.domains)  # two windows of each domain
    assert (ev["curve_evaluations"], ev["curve_eval_tokens_each"]) == (3, curve)  # at 25, 50, 75; the one at 100 is whole
    assert ev["eval_tokens"] == 3 * curve + ev["eval_tokens_each"] + ev["final_eval_tokens"]
    assert _evaluations_text(ev) == f"3 x {_n(curve)} + 1 x {_n(ev['eval_tokens_each'])} + {_n(ev['final_eval_tokens'])} tokens"
