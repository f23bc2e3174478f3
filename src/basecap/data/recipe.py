"""Corpus recipes: TOML files validated into typed configs.

A recipe declares domains (``[domains.<name>]``) and a list of sources (``[[sources]]``), each of
which feeds one domain, or several through a field of each record (jsonl). Built-in recipes live
in ``basecap/data/recipes/*.toml``; ``load_recipe`` takes a built-in name or a path.
"""

from __future__ import annotations

import os
import tomllib
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import Discriminator, Field, Tag, ValidationError, field_validator, model_validator

from ..config_base import ConfigError, Strict, check_name, format_validation_error, valid_name

SPLITS = ("train", "validation", "test")


class DomainConfig(Strict):
    role: Literal["train", "heldout"] = "train"  # documentation only: the loader's weights decide
    description: str = ""
    max_bytes: int | None = Field(default=None, gt=0)  # cap on UTF-8 text, deterministic selection
    optional: bool = False  # when every source is missing: skip the domain instead of failing


class _SourceBase(Strict):
    name: str | None = None  # id in the manifest; defaults to kind + index
    domain: str | None = None
    license: str = "unspecified"
    optional: bool = False  # missing client or files: skip with a one-line message
    max_bytes: int | None = Field(default=None, gt=0)  # cap per source (and per target domain)
    clean: Literal["none", "email"] = "none"


class _MemberSource(_SourceBase):
    include: list[str] = ["**/*"]
    exclude: list[str] = []
    format: Literal["text", "json"] = "text"  # json: one document per file, in text_field
    text_field: str = "text"


SHA256 = r"^[0-9a-f]{64}$"


class PipSdistSource(_MemberSource):
    """Members of a source distribution, fetched from the package index's simple API (no pip, no build
    backend runs). ``sha256`` is required and checked before the archive is kept or unpacked."""

    kind: Literal["pip_sdist"] = "pip_sdist"
    package: str = Field(pattern=r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")  # a PEP 508 name, never a URL
    version: str = Field(pattern=r"^[0-9][0-9A-Za-z.!+_-]*$")  # an exact release
    sha256: str = Field(pattern=SHA256)


class NpmPackSource(_MemberSource):
    """Members of an npm package fetched with ``npm pack --ignore-scripts`` from the registry (a name and
    an exact version: no git, URL or folder specs, which npm would build). ``sha256`` is required."""

    kind: Literal["npm_pack"] = "npm_pack"
    package: str = Field(pattern=r"^(@[a-z0-9][a-z0-9._~-]*/)?[a-z0-9][a-z0-9._~-]*$")
    version: str = Field(pattern=r"^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$")
    sha256: str = Field(pattern=SHA256)


class FilesSource(_MemberSource):
    """Text files under a folder (``{stdlib}``, ``~`` and ``$VARS`` expand; globs allowed)."""

    kind: Literal["files"] = "files"
    root: str
    exclude_dirs: list[str] = []  # folder names pruned anywhere in the walk


class _RecordSource(_SourceBase):
    """Records with a text field, one domain or a domain per record (``domain_field`` + ``domain_map``)."""

    kind: str
    paths: list[str]  # globs; relative paths are relative to the recipe file
    text_field: str = "text"
    domain_field: str | None = None  # dotted path, e.g. "meta.redpajama_set_name"
    domain_map: dict[str, str] = {}  # field value -> recipe domain; unmapped values are counted
    fingerprint: Literal["content", "stat"] = "content"  # stat: size+mtime, for very large data

    @model_validator(mode="after")
    def _target(self):
        if self.domain_field is None and self.domain is None:
            raise ValueError(f"a {self.kind} source needs `domain`, or `domain_field` with `domain_map`")
        if self.domain_field is not None and not self.domain_map:
            raise ValueError("`domain_field` needs a `domain_map` from field values to domains")
        return self


class JsonlSource(_RecordSource):
    """jsonl / jsonl.zst / jsonl.gz records, read as a stream (SlimPajama layout by default)."""

    kind: Literal["jsonl"] = "jsonl"


class TableSource(_RecordSource):
    """Columnar records (parquet, arrow, hf_disk), read by ``tables.py`` one record batch at a time."""

    batch_rows: int = Field(default=1024, gt=0)  # rows per record batch read (bounds memory)


class ParquetSource(TableSource):
    """Parquet files; a path that is a folder stands for every ``*.parquet`` under it."""

    kind: Literal["parquet"] = "parquet"


class ArrowSource(TableSource):
    """Arrow IPC files or streams (``.arrow``, ``.feather``); a folder stands for its ``*.arrow`` files."""

    kind: Literal["arrow"] = "arrow"


class HFDiskSource(TableSource):
    """Folders written by ``datasets``' ``save_to_disk`` (a Dataset, or a DatasetDict of splits)."""

    kind: Literal["hf_disk"] = "hf_disk"
    splits: list[str] = []  # of a DatasetDict; empty: every split, in dataset_dict.json order


class PythonTopicsSource(_SourceBase):
    """The Python reference topics shipped with every CPython (``pydoc_data.topics``)."""

    kind: Literal["python_topics"] = "python_topics"


Source = Annotated[
    Union[PipSdistSource, NpmPackSource, FilesSource, JsonlSource, ParquetSource, ArrowSource, HFDiskSource, PythonTopicsSource],
    Field(discriminator="kind"),
]


class SplitConfig(Strict):
    validation: float = Field(default=0.05, ge=0, lt=1)
    test: float = Field(default=0.05, ge=0, lt=1)
    min_validation_tokens: int = Field(default=131072, ge=0)
    min_test_tokens: int = Field(default=131072, ge=0)

    @model_validator(mode="after")
    def _fractions(self):
        if self.validation + self.test >= 1:
            raise ValueError("validation + test fractions must be below 1")
        return self


class BPETokenizerConfig(Strict):
    kind: Literal["bpe"] = "bpe"
    vocab_size: int = Field(default=8192, ge=300, le=2**31 - 1)
    sample_bytes_per_domain: int = Field(default=4_000_000, gt=0)
    min_frequency: int = Field(default=2, ge=1)
    train_domains: list[str] | None = Field(
        default=None,
        description="domains whose samples train the BPE (default: every "
        "domain); the training domains only is the control for held-out tokens that "
        "training never sees (docs/metrics.md)",
    )


class FileTokenizerConfig(Strict):
    kind: Literal["file"] = "file"
    path: str  # a tokenizer.json; relative paths are relative to the recipe file
    eot_token: str = "<|endoftext|>"


def _tokenizer_kind(v: Any) -> str | None:
    if isinstance(v, dict):
        return v.get("kind", "file" if "path" in v else "bpe")
    return getattr(v, "kind", None)


TokenizerConfig = Annotated[
    Union[Annotated[BPETokenizerConfig, Tag("bpe")], Annotated[FileTokenizerConfig, Tag("file")]],
    Discriminator(_tokenizer_kind),
]


class BuildConfig(Strict):
    """How a corpus is built; never what it contains (left out of the cache key and the manifest)."""

    workers: int | None = Field(default=None, ge=1)  # tokenising processes; None: the usable CPU count
    unit_bytes: int = Field(default=4_000_000, gt=0)  # text per committed unit of tokenised work


class RecipeConfig(Strict):
    name: str
    description: str = ""
    domains: dict[str, DomainConfig]
    sources: list[Source]
    splits: SplitConfig = SplitConfig()
    tokenizer: TokenizerConfig = BPETokenizerConfig()
    build: BuildConfig = BuildConfig()

    @field_validator("name")
    @classmethod
    def _name(cls, v):
        return valid_name(v, "recipe names")

    @model_validator(mode="after")
    def _consistent(self):
        if not self.domains:
            raise ValueError("a recipe needs at least one domain")
        for d in self.domains:
            check_name(d, f"domains[{d!r}]", "domain names")  # a domain names its token files
        folded = [d.lower() for d in self.domains]
        if len(set(folded)) != len(folded):
            raise ValueError(f"domains: names that differ only in case name the same files on some systems: {sorted(self.domains)}")
        fed = set()
        names = set()
        for i, s in enumerate(self.sources):
            targets = [s.domain] if s.domain is not None else []
            if isinstance(s, _RecordSource):
                targets += list(s.domain_map.values())
            for t in targets:
                if t not in self.domains:
                    raise ValueError(f"sources.{i} feeds unknown domain {t!r}; declared: {sorted(self.domains)}")
            if not targets:
                raise ValueError(f"sources.{i} ({s.kind}) needs `domain`")
            fed.update(targets)
            sid = source_id(s, i)
            if sid in names:
                raise ValueError(f"sources.{i}: duplicate source name {sid!r}")
            names.add(sid)
        starved = sorted(set(self.domains) - fed)
        if starved:
            raise ValueError(f"domains without any source: {starved}")
        tdoms = getattr(self.tokenizer, "train_domains", None)
        if tdoms is not None and (not tdoms or set(tdoms) - set(self.domains)):
            raise ValueError(f"tokenizer.train_domains {tdoms}: needs at least one of the recipe's domains {sorted(self.domains)}")
        return self


def source_id(src: Source, index: int) -> str:
    if src.name:
        return src.name
    label = getattr(src, "package", None) or src.kind
    return f"{index}-{label.replace('/', '_').lstrip('@')}"


def builtin_recipes() -> list[str]:
    folder = resources.files("basecap.data") / "recipes"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".toml"))


def _resolve_paths(raw: dict, base: Path) -> dict:
    """Make relative paths in a user's recipe relative to the recipe file, not the cwd."""

    def fix(p: str) -> str:
        if p.startswith(("{", "~", "$", "/")):
            return p
        return str(base / p)

    for src in raw.get("sources", []) or []:
        if not isinstance(src, dict):
            continue
        if isinstance(src.get("root"), str) and src.get("kind") == "files":
            src["root"] = fix(src["root"])
        if isinstance(src.get("paths"), list):
            src["paths"] = [fix(p) if isinstance(p, str) else p for p in src["paths"]]
    tok = raw.get("tokenizer")
    if isinstance(tok, dict) and isinstance(tok.get("path"), str):
        tok["path"] = fix(tok["path"])
    return raw


def recipe_from_dict(raw: dict, origin: str = "recipe") -> RecipeConfig:
    try:
        return RecipeConfig.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(f"{origin}: " + format_validation_error(e)) from None


def _read_recipe(name_or_path: str | os.PathLike) -> tuple[dict, str]:
    """(the raw tables of a built-in recipe or a recipe file, a name for messages)."""
    p = Path(name_or_path).expanduser()
    builtin = builtin_recipes()
    if p.suffix == ".toml" or p.exists() or os.sep in str(name_or_path):
        if not p.is_file():
            raise ConfigError(f"recipe file not found: {p} (built-in recipes: {builtin})")
        text, base, origin = p.read_text(encoding="utf-8"), p.resolve().parent, str(p)
    elif str(name_or_path) in builtin:
        res = resources.files("basecap.data") / "recipes" / f"{name_or_path}.toml"
        text, base, origin = res.read_text(encoding="utf-8"), None, f"built-in recipe {name_or_path!r}"
    else:
        raise ConfigError(f"unknown recipe {str(name_or_path)!r}: not a file and not one of {builtin}")
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{origin}: invalid TOML: {e}") from None
    return (_resolve_paths(raw, base) if base is not None else raw), origin


def _merge_recipe(base: dict, over: dict) -> dict:
    """``over`` on top of ``base``: tables merge key by key, anything else (lists of sources included) replaces."""
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge_recipe(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
    return out


def load_recipe(name_or_path: str | os.PathLike) -> RecipeConfig:
    """A built-in recipe by name (e.g. ``"default"``) or a TOML file by path. A recipe may start from a
    built-in one with ``extends = "default"`` and change some of its tables (e.g. ``[tokenizer] vocab_size``)."""
    raw, origin = _read_recipe(name_or_path)
    if "extends" in raw:
        parent = raw.pop("extends")
        if not isinstance(parent, str) or parent not in builtin_recipes():
            raise ConfigError(f"{origin}: extends: {parent!r} is not a built-in recipe; allowed: {builtin_recipes()}")
        base, _ = _read_recipe(parent)
        if "extends" in base:
            raise ConfigError(f"{origin}: extends: {parent!r} extends another recipe itself (one level only)")
        raw = _merge_recipe(base, raw)
    return recipe_from_dict(raw, origin)
