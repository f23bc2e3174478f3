"""lm-evaluation-harness adapter: real lm-eval runs on a tiny model over basecap's local-jsonl tasks
(multiple choice, rolling perplexity, generation), scoring agrees with the model, the CLI wrapper
works, and a task whose dataset is not available offline fails with a message naming it."""

import json
import math
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
pytest.importorskip("lm_eval")

from test_eval_suites import TinyCorpus, no_builtin_tasks, tiny_subject  # noqa: E402,F401

from basecap.eval import harness  # noqa: E402
from basecap.eval.suites import run_suite  # noqa: E402


@pytest.fixture(autouse=True)
def isolated(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("BASECAP_HOME", str(tmp_path_factory.getbasetemp() / "home"))
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def subject():
    return tiny_subject(TinyCorpus())


class Req:
    def __init__(self, *args):
        self.args = args


@torch.no_grad()
def test_scoring_matches_the_model(subject):
    lm = harness.BasecapLM(subject=subject, batch_size=3, max_length=64)
    ctx, conts = "the river carried", [" old boats", " silver", " a grey sky near the market square"]
    got = lm.loglikelihood([Req(ctx, c) for c in conts] + [Req("", " the river")])
    for c, (lp, greedy) in zip(conts, got):
        a, b = subject.encode(ctx), subject.encode(ctx + c)[len(subject.encode(ctx)):]
        logits, _ = subject.model(torch.tensor([a + b]))
        logp = torch.log_softmax(logits[0, len(a) - 1:-1], -1)
        assert lp == pytest.approx(float(logp.gather(-1, torch.tensor(b)[:, None]).sum()), rel=1e-5, abs=1e-5)
        assert greedy == bool((logp.argmax(-1) == torch.tensor(b)).all())
    text = " ".join(["the river carried old boats past the quiet town"] * 20)  # longer than max_length
    (rolling,) = lm.loglikelihood_rolling([Req(text)])
    doc, L = subject.encode(text), 64
    assert len(doc) > 2 * L
    total = 0.0
    for s in range(0, len(doc), L):  # disjoint windows, every token predicted once, full context in the last
        if s == 0:
            inp, n_new = [subject.eot_id] + doc[:L - 1], L
        elif s + L <= len(doc):
            inp, n_new = doc[s - 1:s + L - 1], L
        else:
            inp, n_new = doc[len(doc) - L - 1:len(doc) - 1], len(doc) - s
        logits, _ = subject.model(torch.tensor([inp]))
        tgt = torch.tensor(doc[s:s + n_new])
        total += float(torch.log_softmax(logits[0, -n_new:], -1).gather(-1, tgt[:, None]).sum())
    assert rolling == pytest.approx(total, rel=1e-5)
    outs = lm.generate_until([Req("the river", {"until": ["\n"], "max_gen_toks": 5}),
                              Req("the river", {"until": ["."], "max_gen_toks": 5})])
    ref = subject.decode(subject.model.generate(torch.tensor([subject.encode("the river")]), 5)[0].tolist())
    assert outs[0] == ref.split("\n")[0] and outs[1] == ref.split(".")[0]


def test_real_lm_eval_run_on_local_tasks(subject, tmp_path):
    tasks = ["basecap_smoke_mc", "basecap_smoke_ppl", "basecap_smoke_gen"]
    res = run_suite(subject, "lm-eval", out_dir=tmp_path, tasks=tasks, limit=4, batch_size=4)
    saved = json.loads((tmp_path / "eval_lm-eval.json").read_text())
    assert saved["summary"] == res["summary"]
    s = res["summary"]
    assert 0 <= s["basecap_smoke_mc"]["acc"] <= 1 and 0 <= s["basecap_smoke_mc"]["acc_norm"] <= 1
    assert math.isfinite(s["basecap_smoke_ppl"]["bits_per_byte"]) and s["basecap_smoke_ppl"]["word_perplexity"] > 1
    assert s["basecap_smoke_gen"]["contains"] in (0.0, 0.25, 0.5, 0.75, 1.0)
    assert res["n-samples"]["basecap_smoke_mc"]["effective"] == 4


def test_tasks_generated_from_the_corpus(subject, tmp_path):
    res = harness.run_lm_eval(subject, ["basecap_corpus"], limit=2, batch_size=4)
    assert set(res["results"]) >= {"basecap_ppl_prose", "basecap_ppl_other", "basecap_extraction"}
    assert res["results"]["basecap_ppl_other"]["bits_per_byte,none"] > 0
    a = harness.write_corpus_tasks(subject, tmp_path / "a", n_docs=3, n_extraction=2)
    b = harness.write_corpus_tasks(subject, tmp_path / "b", n_docs=3, n_extraction=2)
    for f in ("ppl_prose.jsonl", "extraction.jsonl"):
        assert (a / f).read_text() == (b / f).read_text()  # deterministic by seed
    rec = json.loads((a / "extraction.jsonl").read_text().splitlines()[0])
    assert rec["answers"][0] in rec["context"]
    ppl = (a / "basecap_ppl_prose.yaml").read_text()  # filled in from tasks/templates/
    assert "task: basecap_ppl_prose\n" in ppl and f'test: "{(a / "ppl_prose.jsonl").resolve()}"\n' in ppl
    assert "$" not in ppl + (a / "basecap_extraction.yaml").read_text()
    shipped = harness.prepare_task_dir(tmp_path / "shipped")  # the templates are not tasks themselves
    assert sorted(p.name for p in shipped.rglob("*.yaml")) == [
        "basecap_smoke_gen.yaml", "basecap_smoke_mc.yaml", "basecap_smoke_ppl.yaml"]


def test_lm_eval_options_match_the_suite():
    import inspect

    from basecap.eval.suites import LM_EVAL_OPTIONS, check_suite_options

    assert list(LM_EVAL_OPTIONS) == [p for p in inspect.signature(harness.lm_eval_suite).parameters
                                     if p not in ("subject", "out_dir")]
    check_suite_options("lm-eval", {"tasks": ["arc_easy"], "num_fewshot": 0})
    with pytest.raises(Exception, match="num_shots"):
        check_suite_options("lm-eval", {"num_shots": 0})


def test_contains_metric():
    assert harness.contains_results({"answer": "Lisbon"}, [" lisbon and more"]) == {"contains": 1.0}
    assert harness.contains_results({"answers": ["x", "Oslo"]}, ["Riga"]) == {"contains": 0.0}


def test_missing_dataset_names_it(subject, tmp_path, no_builtin_tasks):
    task = tmp_path / "tasks"
    task.mkdir()
    (task / "absent.yaml").write_text(
        "task: basecap_absent\ndataset_path: someorg/not_in_cache\ndataset_name: main\ntest_split: test\n"
        "output_type: multiple_choice\ndoc_to_text: '{{q}}'\ndoc_to_choice: '{{c}}'\ndoc_to_target: 0\n")
    with pytest.raises(harness.LMEvalDataError, match="someorg/not_in_cache / main"):
        harness.run_lm_eval(subject, ["basecap_absent"], include_path=str(task), limit=1)
    with pytest.raises(Exception, match="unknown lm-eval task"):
        harness.run_lm_eval(subject, ["basecap_no_such_task"], limit=1)
    with pytest.raises(harness.LMEvalDataError, match="someorg/not_in_cache"):  # the CLI wrapper too
        harness.main(["--model", "dummy", "--tasks", "basecap_absent", "--include_path", str(task), "--limit", "1"])
