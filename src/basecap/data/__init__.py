"""Data pipeline: corpus recipes, sources, tokenizer, token shards and batch loaders.

    recipe = load_recipe("default")          # built-in name or path to a TOML recipe
    corpus = build_corpus(recipe)             # builds once, then reuses the cached corpus
    tb = TrainBatches(corpus, weights={"prose": 1.0}, seq_len=256, batch_size=8, seed=0)
    x, y = tb.batch(step)
    for x, y in eval_batches(corpus, "code", split="validation", seq_len=256): ...

See docs/data.md for recipes, sources and the default corpus.
"""

from .build import build_corpus, data_home
from .corpus import Corpus, load_corpus, summarize
from .loader import TrainBatches, eval_batches
from .recipe import RecipeConfig, builtin_recipes, load_recipe, recipe_from_dict
from .source_base import DataError, MalformedRecordWarning

__all__ = [
    "Corpus",
    "DataError",
    "MalformedRecordWarning",
    "RecipeConfig",
    "TrainBatches",
    "build_corpus",
    "builtin_recipes",
    "data_home",
    "eval_batches",
    "load_corpus",
    "load_recipe",
    "recipe_from_dict",
    "summarize",
]
