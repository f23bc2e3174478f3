"""The paper's setting end to end: the built-in slimpajama recipe on generated shards of SlimPajama's layout."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_data_helpers import SLIMPAJAMA_SETS, slimpajama_records, write_jsonl_zst

from basecap.config import load_experiment
from basecap.data import TrainBatches, build_corpus, load_recipe

REPO = Path(__file__).resolve().parents[1]
DOMAINS = {"commoncrawl": "RedPajamaCommonCrawl", "c4": "RedPajamaC4", "arxiv": "RedPajamaArXiv",
           "github": "RedPajamaGithub", "stackexchange": "RedPajamaStackExchange"}
LIMITED = {"commoncrawl": 0.66, "c4": 0.34}
MIXED = {"commoncrawl": 0.522, "c4": 0.267, "github": 0.052, "arxiv": 0.046, "stackexchange": 0.033}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("slimpajama")
    # SlimPajama's layout: <split>/chunk<k>/example_<split>_<i>.jsonl.zst, every set mixed in every file
    for i in range(3):
        write_jsonl_zst(root / "sp" / "train" / "chunk1" / f"example_train_{i}.jsonl.zst", slimpajama_records(70, seed=i))
    write_jsonl_zst(root / "sp" / "validation" / "chunk1" / "example_holdout_0.jsonl.zst", slimpajama_records(35, seed=9))
    mp = pytest.MonkeyPatch()
    mp.setenv("SLIMPAJAMA_DIR", str(root / "sp"))
    try:
        yield build_corpus(load_recipe("slimpajama"), home=root / "home", log=lambda m: None, workers=2)
    finally:
        mp.undo()


def _docs(corpus, domain: str, split: str) -> list[str]:
    toks = np.asarray(corpus.tokens(domain, split))
    cuts = np.flatnonzero(toks == corpus.eot_id)
    starts = np.concatenate([[0], cuts[:-1] + 1])
    return [corpus.tokenizer.decode(toks[a:b].tolist(), skip_special_tokens=False) for a, b in zip(starts, cuts)]


def test_paper_domains_roles_and_unused_sets(corpus):
    m = corpus.manifest
    assert corpus.domains == list(DOMAINS)
    assert {d for d in DOMAINS if m["domains"][d]["role"] == "train"} == {"commoncrawl", "c4"}
    src = m["sources"][0]
    assert src["kind"] == "jsonl" and src["files"] == 4 and src["malformed"] == 0
    assert set(src["unmapped"]) == {"RedPajamaBook", "RedPajamaWikipedia"}
    per_set = 245 // len(SLIMPAJAMA_SETS)
    assert sum(src["unmapped"].values()) == 2 * per_set


def test_every_domain_holds_its_set_only_and_splits_are_disjoint(corpus):
    seen = set()
    for domain, set_name in DOMAINS.items():
        tag = "marker" + set_name.removeprefix("RedPajama").lower() + " "
        for split in ("train", "validation", "test"):
            docs = _docs(corpus, domain, split)
            assert docs, (domain, split)
            assert all(d.startswith(tag) for d in docs), (domain, split)
            ids = {d.split("\n", 1)[0] for d in docs}
            assert not ids & seen  # no document in two splits or two domains
            seen |= ids
    assert len(seen) == 5 * 245 // len(SLIMPAJAMA_SETS)


def test_limited_and_mixed_training_weights(corpus):
    limited = TrainBatches(corpus, weights=LIMITED, seq_len=32, batch_size=16, seed=0)
    assert limited.domains == ["commoncrawl", "c4"]
    assert set(np.concatenate([limited.windows(s)[0] for s in range(10)]).tolist()) == {0, 1}
    mixed = TrainBatches(corpus, weights=MIXED, seq_len=32, batch_size=64, seed=0)
    assert mixed.domains == list(DOMAINS)
    x, _ = mixed.batch(3)
    assert x.shape == (64, 32) and int(x.max()) < corpus.vocab_size


def test_documented_overrides_validate():
    path = REPO / "experiments" / "paper" / "architectures.toml"
    if not path.is_file():
        pytest.skip("experiment files not present")
    weights = "{commoncrawl = 0.522, c4 = 0.267, github = 0.052, arxiv = 0.046, stackexchange = 0.033}"  # as in docs/data.md
    exp = load_experiment(path, ["data.recipe=slimpajama", f"data.train_weights={weights}", "name=architectures_mixed"])
    run = exp.resolve()[0]
    assert exp.name == "architectures_mixed" and run.data.recipe == "slimpajama"
    assert run.data.train_weights == MIXED
