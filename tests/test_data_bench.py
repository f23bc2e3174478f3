"""``basecap bench data`` runs end to end on a tiny corpus and writes its JSON."""

from __future__ import annotations

import json

from test_data_helpers import make_tiny_data, tiny_recipe

from basecap.bench import data as bench_data
from basecap.data import build_corpus, recipe_from_dict


def test_bench_data_small(tmp_path, capsys):
    data = make_tiny_data(tmp_path / "data")
    corpus = build_corpus(recipe_from_dict(tiny_recipe(data)), home=tmp_path / "home", log=lambda m: None, workers=1)
    out = tmp_path / "out"
    res = bench_data.main(["--corpus", str(corpus.dir), "--mb", "0.05", "--unit-bytes", "10000", "--workers", "2",
                           "--step-time", "0.1", "--out", str(out)])
    assert [r["workers"] for r in res["tokenize"]] == [1, 2] and all(r["mb_per_s"] > 0 for r in res["tokenize"])
    shapes = {r["shape"]: r for r in res["loader"]}
    assert shapes["110m"]["batch_size"] == 32 and shapes["110m"]["seq_len"] == 2048 and shapes["110m"]["world_size"] == 8
    assert shapes["110m"]["pct_of_step_reference"] == 100 * shapes["110m"]["batch_s"] / 0.1
    assert json.loads((out / "data.json").read_text())["loader"][1]["shape"] == "tiny"
    printed = capsys.readouterr().out
    assert "MB/s" in printed and "batches/s" in printed
