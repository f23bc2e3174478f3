import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import pytest
import torch

transformers = pytest.importorskip("transformers")

from basecap.config import validate_run  # noqa: E402
from basecap.data.tokenizer import EOT, load_tokenizer  # noqa: E402
from basecap.eval.final import load_trained  # noqa: E402
from basecap.train import train  # noqa: E402

PROMPTS = ["The king said", "def return self", "Love and death at sea", "x"]
MIXERS = {"attention": {"name": "attention", "head_dim": 8}, "deltanet": {"name": "deltanet", "head_dim": 8}}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _train(recipe, corpus, run_dir, mixer, tie=False, steps=60):
    cfg = validate_run({
        "name": "hf", "seed": 0,
        "data": {"recipe": str(recipe), "train_weights": {"prose": 1.0, "code": 1.0}, "seq_len": 32},
        "model": {"d_model": 32, "n_layers": 2, "max_seq_len": 64, "mixer": mixer, "tie_embeddings": tie},
        "train": {"steps": steps, "batch_size": 8, "warmup_steps": 2, "checkpoint_every": steps, "progress": False, "lr": 2e-2,
                  "threads": 1},
        "eval": {"every": steps, "max_tokens": 256, "batch_size": 4},
    })
    train(cfg, run_dir, corpus=corpus, log=lambda *_: None)
    return run_dir


@pytest.fixture(scope="module")
def exported(tiny_corpus, tiny_recipe_path, tmp_path_factory):
    """name -> (run_dir, export_dir) for a tiny trained attention and deltanet model."""
    from basecap.hf import export_run

    root = tmp_path_factory.mktemp("hf")
    out = {}
    for name, mixer in MIXERS.items():
        run = _train(tiny_recipe_path, tiny_corpus, root / f"run_{name}", mixer)
        out[name] = (run, export_run(run, root / f"hf_{name}", corpus=tiny_corpus, log=lambda *_: None))
    return out


def _load(path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def test_export_folder_loads_with_auto_classes(exported, tiny_corpus):
    from transformers import PreTrainedTokenizerFast

    from basecap.hf import BasecapForCausalLM

    run, out = exported["attention"]
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
            "generation_config.json"} <= names
    lm, *_ = load_trained(run, tiny_corpus, log=lambda *_: None)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "basecap" and cfg["basecap"] == json.loads(lm.cfg.model_dump_json())
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == tiny_corpus.eot_id

    model, tok = _load(out)
    assert isinstance(model, BasecapForCausalLM) and isinstance(tok, PreTrainedTokenizerFast)
    assert tok.eos_token == EOT and tok.eos_token_id == tiny_corpus.eot_id and tok.pad_token_id == tiny_corpus.eot_id
    ours, _ = load_tokenizer(tiny_corpus.tokenizer_path)
    for text in PROMPTS:
        assert tok.encode(text) == ours.encode(text).ids and tok.decode(tok.encode(text)) == text

    mine, theirs = lm.state_dict(), model.model.state_dict()
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    ids = torch.tensor([tok.encode("The king said to the sea")])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, lm(ids)[0])


@pytest.mark.parametrize("name", list(MIXERS))
def test_generate_matches_basecap_greedy_decoding(exported, tiny_corpus, name):
    run, out = exported[name]
    lm, *_ = load_trained(run, tiny_corpus, log=lambda *_: None)
    model, tok = _load(out)
    outs = set()
    for text in PROMPTS:
        ids = torch.tensor([tok.encode(text)])
        want = lm.generate(ids, 10)
        for use_cache in (True, False):
            got = model.generate(ids, max_new_tokens=10, do_sample=False, use_cache=use_cache, eos_token_id=None,
                                 return_dict_in_generate=True, output_logits=True)
            assert torch.equal(got.sequences[:, ids.shape[1]:], want), (text, use_cache)
        # the cached decode's per-step logits equal one full forward over the final sequence
        with torch.no_grad():
            full, _ = lm(got.sequences[:, :-1])
        step_logits = torch.stack(got.logits, 1)
        assert torch.allclose(step_logits, full[:, ids.shape[1] - 1:], atol=1e-4, rtol=1e-4)
        outs.add(tuple(want[0].tolist()))
    assert len(outs) > 1, "prompts should lead to different continuations"


def test_beam_search_and_sampling_agree_with_and_without_the_cache(exported):
    _, out = exported["deltanet"]  # beams reorder recurrent states and conv caches, not only KV caches
    model, tok = _load(out)
    ids = torch.tensor([tok.encode("The king said")])
    kw = dict(max_new_tokens=6, eos_token_id=None, num_return_sequences=2)
    beams = [model.generate(ids, num_beams=3, do_sample=False, use_cache=c, **kw) for c in (True, False)]
    assert torch.equal(*beams)
    samples = []
    for c in (True, False):
        torch.manual_seed(0)
        samples.append(model.generate(ids, do_sample=True, temperature=1.5, use_cache=c, **kw))
    assert torch.equal(*samples)


def test_labels_loss_padding_and_batching(exported, tiny_corpus):
    run, out = exported["deltanet"]
    lm, *_ = load_trained(run, tiny_corpus, log=lambda *_: None)
    model, tok = _load(out)
    ids = torch.tensor([tok.encode("The king said to the queen and the sea")])
    with torch.no_grad():
        res = model(ids, labels=ids)
        assert res.loss == pytest.approx(float(lm.loss(ids[:, :-1], ids[:, 1:])), rel=1e-5)
        # right padding (how lm-eval batches loglikelihood requests): real positions are unaffected
        short = torch.tensor([tok.encode("The king")])
        pad = torch.full((1, ids.shape[1] - short.shape[1]), tok.pad_token_id)
        batch = torch.cat([ids, torch.cat([short, pad], 1)])
        mask = (torch.arange(ids.shape[1]) < torch.tensor([[ids.shape[1]], [short.shape[1]]])).long()
        logits = model(batch, attention_mask=mask).logits
        assert torch.allclose(logits[1, :short.shape[1]], lm(short)[0][0], atol=1e-5)
        labels = batch.masked_fill(mask == 0, -100)
        assert torch.isfinite(model(batch, attention_mask=mask, labels=labels).loss)
        with pytest.raises(ValueError, match="right padding"):
            model(batch, attention_mask=mask.flip(1))
        with pytest.raises(ValueError, match="padded batches"):
            model.generate(batch, attention_mask=mask.flip(1), max_new_tokens=2)


def test_weights_that_do_not_match_the_model_are_an_error(exported, tmp_path):
    import shutil

    _, out = exported["attention"]
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["basecap"]["n_layers"] = 3  # e.g. an export from a basecap version whose model differs
    (bad / "config.json").write_text(json.dumps(cfg))
    assert json.loads((out / "basecap_export.json").read_text())["run_id"] == "hf-s0"
    with pytest.raises(ValueError, match="do not match.*missing_keys"):
        _load(bad)


def test_tied_embeddings_round_trip(tiny_corpus, tiny_recipe_path, tmp_path):
    from basecap.hf import export_run

    run = _train(tiny_recipe_path, tiny_corpus, tmp_path / "run", MIXERS["attention"], tie=True, steps=4)
    out = export_run(run, tmp_path / "hf", corpus=tiny_corpus, log=lambda *_: None)
    lm, *_ = load_trained(run, tiny_corpus, log=lambda *_: None)
    model, tok = _load(out)
    assert model.model.head.weight is model.model.embed.weight
    ids = torch.tensor([tok.encode("The king said")])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, lm(ids)[0])


TASK_YAML = """task: basecap_tiny_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{label}}}}"
metric_list:
  - metric: acc
"""


def _loglikelihood(lm, tok, context, continuation):
    """lm-eval's causal-LM scoring: encode context+continuation, split at the context's length."""
    whole = tok.encode(context + continuation)
    n_ctx = len(tok.encode(context))
    ids = torch.tensor([whole])
    with torch.no_grad():
        logp = torch.log_softmax(lm(ids)[0][0, :-1].float(), -1)
    return float(sum(logp[i - 1, whole[i]] for i in range(n_ctx, len(whole))))


def test_lm_eval_hf_model_scores_a_local_task(exported, tiny_corpus, tmp_path):
    pytest.importorskip("accelerate")
    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager

    docs = [{"question": "The king said", "choices": ["to the queen", "def return", "x y"], "label": 0},
            {"question": "def return self", "choices": ["if else", "the whale", "love"], "label": 0},
            {"question": "The sea", "choices": ["was", "lambda", "("], "label": 1}]
    data = tmp_path / "tiny.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in docs))
    (tmp_path / "tiny.yaml").write_text(TASK_YAML.format(data=data))
    run, out = exported["deltanet"]
    res = lm_eval.simple_evaluate(model="hf", model_args={"pretrained": str(out), "device": "cpu", "dtype": "float32"},
                                  tasks=["basecap_tiny_mc"], task_manager=TaskManager(include_path=str(tmp_path), include_defaults=False),
                                  batch_size=2, log_samples=True)
    lm, *_ = load_trained(run, tiny_corpus, log=lambda *_: None)
    _, tok = _load(out)
    samples = res["samples"]["basecap_tiny_mc"]
    assert len(samples) == len(docs)
    correct = 0
    for s in samples:
        doc = s["doc"]
        got = [float(r[0]) for r in s["filtered_resps"]]
        want = [_loglikelihood(lm, tok, doc["question"], " " + c) for c in doc["choices"]]
        assert got == pytest.approx(want, rel=1e-4, abs=1e-4)
        correct += int(max(range(len(want)), key=want.__getitem__) == doc["label"])
    assert res["results"]["basecap_tiny_mc"]["acc,none"] == pytest.approx(correct / len(docs))
