"""Task suites: generators are deterministic and well formed, scoring normalises, every suite runs
end to end on a tiny random model and writes its JSON, and MQAR is learnable by a tiny attention model."""

import json
import random

import numpy as np
import pytest
import torch

from basecap.data.synthetic import IGNORE, extraction_example, fill_prompt, gap_distribution, mqar, niah_parts, passkey_parts
from basecap.eval.recall import (MqarTask, MqarTraining, answer_contained, normalize_answer, read_recall_jsonl,
                                 recall_prompt, train_mqar)
from basecap.eval.suites import Subject, greedy_generate, run_suite, suite_names
from basecap.model import LM, ModelConfig

WORDS = ("the river carried old boats past the quiet town while children watched from the bridge and "
         "merchants counted silver coins under a grey sky near the market square").split()


def _texts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    docs = []
    for _ in range(n):
        sents = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 12))).capitalize() + "." for _ in range(6)]
        docs.append(" ".join(sents[:3]) + "\n\n" + " ".join(sents[3:]))
    return docs


class TinyCorpus:
    """The corpus API the suites use (tokenizer, eot_id, domains, tokens), in memory."""

    def __init__(self):
        from basecap.data.tokenizer import EOT, train_bpe

        self.tokenizer = train_bpe(_texts(40, 0) + ["0123456789 pass key magic special number"] * 5, vocab_size=400, min_frequency=1)
        self.tokenizer.encode_special_tokens = True
        self.eot_id = self.tokenizer.token_to_id(EOT)
        self.vocab_size = self.tokenizer.get_vocab_size()
        self.domains = ["prose", "other"]
        self._tok = {}
        for i, d in enumerate(self.domains):
            for j, split in enumerate(("train", "validation", "test")):
                ids = []
                for t in _texts(30, 10 * i + j + 1):
                    ids += self.tokenizer.encode(t).ids + [self.eot_id]
                self._tok[d, split] = np.array(ids, dtype=np.uint16)

    def tokens(self, domain, split):
        return self._tok[domain, split]


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: threads only contend with each other
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def corpus():
    return TinyCorpus()


@pytest.fixture
def no_builtin_tasks(monkeypatch):
    """Skip indexing lm-eval's ~15k built-in task configs (~40 s here) where a test does not need them."""
    pytest.importorskip("basecap.eval.harness")  # needs lm-eval; sets the offline switches before it loads
    from lm_eval.tasks import TaskManager

    init = TaskManager.__init__
    monkeypatch.setattr(TaskManager, "__init__", lambda self, *a, **kw: init(self, *a, **{**kw, "include_defaults": False}))


def tiny_subject(corpus, position="rope", seq_len=64):
    torch.manual_seed(0)
    model = LM(ModelConfig(vocab_size=corpus.vocab_size, d_model=32, n_layers=2, max_seq_len=seq_len,
                           mixer={"name": "attention", "head_dim": 8, "position": position}))
    return Subject(model=model.eval(), tokenizer=corpus.tokenizer, corpus=corpus, seq_len=seq_len, name="tiny")


# ---- generators -----------------------------------------------------------------------------
def test_mqar_is_deterministic_and_well_formed():
    a = mqar(64, seq_len=64, num_kv_pairs=8, vocab_size=128, seed=3)
    b = mqar(64, seq_len=64, num_kv_pairs=8, vocab_size=128, seed=3)
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)
    test = mqar(64, seq_len=64, num_kv_pairs=8, vocab_size=128, seed=3, split="test")
    assert not torch.equal(a.inputs, test.inputs)
    assert a.inputs.shape == a.targets.shape == (64, 64)
    for n in range(64):
        keys, vals = a.keys[n], a.values[n]
        assert len(set(keys.tolist())) == 8 and len(set(vals.tolist())) == 8  # unique keys and values
        assert (keys >= 1).all() and (keys < 64).all() and (vals >= 64).all() and (vals < 128).all()
        assert a.inputs[n, 0:16:2].tolist() == keys.tolist() and a.inputs[n, 1:16:2].tolist() == vals.tolist()
        labelled = (a.targets[n] != IGNORE).nonzero().flatten().tolist()
        assert sorted(labelled) == sorted(a.query_pos[n].tolist())
        for k, v, q in zip(keys, vals, a.query_pos[n]):
            assert a.inputs[n, q] == k and a.targets[n, q] == v  # the query is the key; its answer is its value
            assert q >= 16 and (q - 16) % 2 == 0


def test_mqar_gaps_follow_the_power_law():
    space, a = 24, 0.01
    d = mqar(4000, seq_len=2 + 2 * space, num_kv_pairs=1, vocab_size=64, power_a=a, seed=0)
    gaps = (d.query_pos[:, 0] - 2) // 2
    freq = np.bincount(gaps, minlength=space) / len(gaps)
    p = gap_distribution(space, a)
    assert np.abs(freq - p).max() < 0.03  # one pair: the marginal is exactly p
    slope = np.polyfit(np.log(np.arange(1, 9)), np.log(freq[:8] + 1e-9), 1)[0]
    assert -1.3 < slope < -0.7  # p(g) ~ (g + 1) ** (a - 1)
    with pytest.raises(ValueError, match="needs seq_len"):
        mqar(4, seq_len=16, num_kv_pairs=8)


def test_needle_prompts_fit_the_length_and_place_the_needle(corpus):
    enc = lambda s: corpus.tokenizer.encode(s).ids  # noqa: E731
    from basecap.data.synthetic import noise_sentences

    for maker in (lambda r: passkey_parts(r), lambda r: niah_parts(r, "uuid"), lambda r: niah_parts(r, "word")):
        p1 = maker(random.Random(5))
        assert p1 == maker(random.Random(5))
        for depth in (0.0, 0.5, 1.0):
            text, n, actual = fill_prompt(enc, p1[0], p1[1], p1[2], noise_sentences(), 600, depth=depth)
            assert 550 <= n <= 600 and n == len(enc(text))
            assert p1[1] in text and text.endswith(p1[2]) and p1[3] in p1[1]
            body = text.split("\n")[1]
            assert abs(body.index(p1[1]) / (len(body) - len(p1[1])) - depth) < 0.1 and abs(actual - depth) < 0.05


def test_extraction_example_asks_back_an_embedded_value():
    ex = extraction_example(random.Random(1), ["First paragraph.", "Second one.", "Third."], n_records=3)
    assert ex == extraction_example(random.Random(1), ["First paragraph.", "Second one.", "Third."], n_records=3)
    assert f"{ex['entity']} {ex['attribute']}: {ex['answers'][0]}" in ex["context"]
    assert ex["question"] == f"{ex['entity']} {ex['attribute']}:"


# ---- scoring --------------------------------------------------------------------------------
def test_answer_normalisation():
    assert normalize_answer("  Lisbon\n ") == "lisbon"
    assert answer_contained(" lisbon, Portugal", ["Lisbon"])
    assert answer_contained("The answer is  New   York", "new york")
    assert answer_contained("x 12345", {"text": ["999", "12345"], "answer_start": [0, 3]})
    assert not answer_contained("Lisbo", ["Lisbon"]) and not answer_contained("anything", [""])


def test_recall_reader_accepts_public_layouts(tmp_path):
    f = tmp_path / "r.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in [
        {"text": "Name: Ada. Year: 1815.", "key": "Year", "value": "1815"},  # SWDE / FDA
        {"context": "Ada was born in London.", "question": "Where was Ada born?", "answers": {"text": ["London"]}},  # SQuAD
        {"document": "Ada.", "answer": "Ada"}]) + "\n")
    recs = read_recall_jsonl(f)
    assert [r["answers"] for r in recs] == [["1815"], ["London"], ["Ada"]]
    assert recall_prompt(recs[0]).endswith("\nYear:")
    assert recall_prompt(recs[1]).endswith("Question: Where was Ada born?\nAnswer:")
    f.write_text(json.dumps({"question": "q"}) + "\n")
    with pytest.raises(ValueError, match="r.jsonl:1"):
        read_recall_jsonl(f)


def test_greedy_generate_matches_model_generate(corpus):
    s = tiny_subject(corpus)
    prompts = [s.encode("the river carried"), s.encode("old boats past"), s.encode("the river carried")]
    outs = greedy_generate(s, prompts, 6, stop_at_eot=False)
    for p, o in zip(prompts, outs):
        ref = s.model.generate(torch.tensor([p]), 6)
        assert o == s.decode(ref[0].tolist())
    assert outs[0] == outs[2]


# ---- suites end to end ------------------------------------------------------------------------
@pytest.mark.parametrize("suite,options", [
    ("passkey", {"lengths": [200, 260], "depths": [0.0, 1.0], "samples": 2}),
    ("niah", {"lengths": [320], "depths": [0.5], "samples": 2, "value_kind": "uuid"}),
    ("recall", {"n": 4, "context_tokens": 48}),
    ("extrapolation", {"windows": 2}),
    ("mqar", {"mode": "pretrained", "num_test": 16, "test_kv_pairs": [2, 4], "seq_len": 32, "vocab_size": 64}),
    ("mqar", {"d_models": [16], "steps": 3, "num_test": 8, "seq_len": 16, "vocab_size": 32,
              "train_kv_pairs": [2], "test_kv_pairs": [2]}),
])
def test_suite_runs_end_to_end(corpus, tmp_path, suite, options):
    s = tiny_subject(corpus)
    res = run_suite(s, suite, out_dir=tmp_path, **options)
    saved = json.loads((tmp_path / f"eval_{suite}.json").read_text())
    assert saved["suite"] == suite and set(res) == set(saved)
    if "plot" in res:
        assert (tmp_path / res["plot"]).stat().st_size > 1000
    again = run_suite(s, suite, out_dir=tmp_path / "again", **options)
    strip = lambda r: {k: v for k, v in r.items() if k not in ("seconds", "runs")}  # noqa: E731
    assert strip(again) == strip(res)  # deterministic by seed


def test_suite_results(corpus, tmp_path):
    s = tiny_subject(corpus)
    res = run_suite(s, "passkey", out_dir=tmp_path, lengths=[200, 400], depths=[0.5], samples=1)
    assert set(res["accuracy"]) == {"200", "400"} and 0 <= res["accuracy"]["400"]["0.5"] <= 1
    assert 380 <= res["cells"][1]["mean_tokens"] <= 400
    res = run_suite(s, "extrapolation", out_dir=tmp_path, windows=2)
    assert res["length"] == 256 and len(res["domains"]["prose"]["loss"]) == 256 // 16
    assert all(np.isfinite(res["domains"]["other"]["loss"]))
    absolute = tiny_subject(corpus, position="absolute", seq_len=256)
    res = run_suite(absolute, "passkey", out_dir=tmp_path, lengths=[100, 200, 300], depths=[0.0], samples=1)
    assert res["accuracy"]["300"]["0"] is None and "absolute" in res["skipped_lengths"]["300"]
    assert res["accuracy"]["100"]["0"] is None and "more than length" in res["skipped_lengths"]["100"]
    assert res["accuracy"]["200"]["0"] is not None
    with pytest.raises(Exception, match="absolute positions"):
        run_suite(absolute, "extrapolation", out_dir=tmp_path)
    with pytest.raises(Exception, match="unknown option"):
        run_suite(s, "passkey", out_dir=tmp_path, lenghts=[4])
    with pytest.raises(Exception, match="unknown suite"):
        run_suite(s, "nope", out_dir=tmp_path)
    assert suite_names() == ["lm-eval", "mqar", "passkey", "niah", "recall", "extrapolation", "decay"]


@pytest.mark.slow  # ~35 s on a busy 2-core machine
def test_mqar_is_learnable_by_a_tiny_attention_model():
    task = MqarTask(vocab_size=64, seq_len=16, train_kv_pairs=(2,), test_kv_pairs=(2,), num_test=256)
    res = train_mqar({"name": "attention", "head_dim": 16}, task, MqarTraining(steps=600, batch_size=32, lr=1e-3),
                     d_model=64, n_layers=2, log=None)
    assert res["acc"][2] > 0.9, res  # chance is 1/32; seeds 0, 1, 2 reach >= 0.98
    assert res["state_bytes"] > 0 and res["params"]["total"] > 0


@pytest.fixture(scope="module")
def trained_run(tiny_recipe_path, tiny_corpus, tmp_path_factory):
    """A real run directory: a tiny attention model trained a few steps on the conftest corpus."""
    from basecap.config import RunConfig
    from basecap.train import train

    cfg = RunConfig(name="ev", data={"recipe": str(tiny_recipe_path), "train_weights": {"prose": 1.0}, "seq_len": 32},
                    model={"d_model": 32, "n_layers": 2, "max_seq_len": 32, "mixer": {"name": "attention", "head_dim": 8}},
                    train={"steps": 4, "batch_size": 4, "warmup_steps": 1, "progress": False},
                    eval={"every": 4, "max_tokens": 256, "batch_size": 4})
    run_dir = tmp_path_factory.mktemp("runs") / cfg.run_id
    train(cfg, run_dir, corpus=tiny_corpus, log=lambda *_: None)
    return run_dir


def test_suites_on_a_run_directory(trained_run):
    res = run_suite(trained_run, "niah", lengths=[400], depths=[0.5], samples=1)
    assert res["model"] == "ev-s0" and res["checkpoint"].startswith("step_")
    assert res["haystack"] == "corpus" and (trained_run / "eval_niah.json").exists()
    assert (trained_run / "eval_niah.png").exists()
    res = run_suite(trained_run, "extrapolation", windows=1, domains=["code"])
    assert res["length"] == 128 and np.isfinite(res["domains"]["code"]["loss"]).all()
    assert res["mean_loss_beyond_train_len"] == pytest.approx(res["domains"]["code"]["loss_beyond_train_len"])
    res = run_suite(trained_run, "recall", n=2)
    assert res["tasks"]["extraction"]["context_tokens"] == 32
    assert res["mean_accuracy"] == res["extraction_accuracy"] == res["accuracy"]["extraction"]


def test_mqar_from_scratch_needs_no_checkpoint(trained_run, tmp_path):
    """MQAR mode "train" trains the run's mixer from its config: a run kept without checkpoints (archived
    records, a reused run) gets the same result as the run with them."""
    import shutil

    opts = {"d_models": [16], "steps": 3, "num_test": 8, "seq_len": 16, "vocab_size": 32, "train_kv_pairs": [2],
            "test_kv_pairs": [2]}
    records = tmp_path / trained_run.name
    shutil.copytree(trained_run, records, ignore=shutil.ignore_patterns("checkpoints", "eval_*"))
    with_weights = run_suite(trained_run, "mqar", out_dir=tmp_path / "a", **opts)
    without = run_suite(records, "mqar", out_dir=tmp_path / "b", **opts)
    assert without["acc_by_d_model"] == with_weights["acc_by_d_model"] and without["model"] == "ev-s0"
    with pytest.raises(FileNotFoundError, match="no usable checkpoint"):  # a suite that reads the weights still needs them
        run_suite(records, "mqar", out_dir=tmp_path / "c", mode="pretrained", num_test=4, test_kv_pairs=[2], seq_len=16,
                  vocab_size=16)


def test_lm_eval_cli_on_a_run_directory(trained_run, tmp_path, capsys, no_builtin_tasks):
    harness = pytest.importorskip("basecap.eval.harness")  # needs lm-eval
    harness.main(["--model", "basecap", "--model_args", f"path={trained_run}", "--tasks", "basecap_smoke_mc,basecap_smoke_gen",
                  "--limit", "2", "--output_path", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert "basecap_smoke_mc" in out and "contains" in out
    (path,) = list((tmp_path / "out").rglob("results_*.json"))
    assert json.loads(path.read_text())["results"]["basecap_smoke_mc"]["acc,none"] in (0.0, 0.5, 1.0)
    res = run_suite(trained_run, "lm-eval", tasks="basecap_smoke_ppl", limit=2)
    assert (trained_run / "eval_lm-eval.json").exists() and res["summary"]["basecap_smoke_ppl"]["bits_per_byte"] > 0


def test_plain_lm_eval_command_finds_basecap(trained_run, tmp_path):
    """``lm_eval --model basecap`` in a fresh process: the .pth hook registers basecap once lm-eval's own models load."""
    import os
    import shutil
    import subprocess
    import sys
    import sysconfig
    from pathlib import Path

    pytest.importorskip("lm_eval")
    from basecap import lm_eval_plugin

    pth = Path(sysconfig.get_paths()["purelib"]) / lm_eval_plugin.PTH_NAME
    assert pth.is_file() and pth.read_text() == lm_eval_plugin.PTH_LINE, \
        "basecap-lm-eval.pth is missing: run ./scripts/setup.sh or `python -c 'from basecap.lm_eval_plugin import main; main()'`"
    setup_py = (Path(__file__).parents[1] / "setup.py").read_text()
    assert repr(lm_eval_plugin.PTH_LINE)[1:-1] in setup_py  # the wheel ships the same line
    exe = shutil.which("lm_eval", path=str(Path(sys.executable).parent)) or shutil.which("lm_eval")
    # the run's corpus is in the test session's data home: opening a run directory never builds a corpus
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    task_dir = subprocess.run([sys.executable, "-c", "from basecap.eval.harness import prepare_task_dir; print(prepare_task_dir())"],
                              env=env, capture_output=True, text=True, check=True).stdout.strip()
    out = subprocess.run([exe, "run", "--model", "basecap", "--model_args", f"path={trained_run}", "--tasks", "basecap_smoke_mc",
                          "--include_path", task_dir, "--limit", "2"], env=env, capture_output=True, text=True, cwd=tmp_path, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "basecap_smoke_mc" in out.stdout and "acc" in out.stdout
    # lm-eval's own models stay registered next to basecap's
    probe = "import lm_eval.api.registry as r; r.get_model('hf'); print(r.get_model('basecap').__name__)"
    assert subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True).stdout.strip() == "BasecapLM"
