"""``basecap export RUN_DIR OUT_DIR``: a trained run as a Hugging Face model folder.

Writes ``config.json`` (model_type ``basecap`` with the full basecap ModelConfig), ``model.safetensors``
(fp32, the newest good checkpoint), the corpus tokenizer (``tokenizer.json``, ``tokenizer_config.json``,
``special_tokens_map.json``; eos = pad = ``<|endoftext|>``) and ``generation_config.json`` (greedy).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import GenerationConfig, PreTrainedTokenizerFast

from ..data.tokenizer import EOT
from ..atomic import atomic_write
from ..rundir import RunDir, environment_info
from .modeling import BasecapConfig, BasecapForCausalLM


def export_tokenizer(tokenizer_path: str | Path, out_dir: str | Path, max_len: int) -> PreTrainedTokenizerFast:
    tok = PreTrainedTokenizerFast(
        tokenizer_file=str(tokenizer_path), eos_token=EOT, pad_token=EOT, model_max_length=max_len, clean_up_tokenization_spaces=False
    )
    if tok.eos_token_id is None or tok.convert_ids_to_tokens(tok.eos_token_id) != EOT:
        raise ValueError(f"tokenizer {tokenizer_path} has no {EOT!r} token")
    tok.save_pretrained(str(out_dir))
    out_dir = Path(out_dir)
    # transformers 5 names the class TokenizersBackend; PreTrainedTokenizerFast (its alias) loads everywhere
    cfg_path = out_dir / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    atomic_write(cfg_path, json.dumps(cfg, indent=2) + "\n")
    special = out_dir / "special_tokens_map.json"
    if not special.exists():  # transformers 5 keeps these in tokenizer_config.json only
        atomic_write(special, json.dumps({"eos_token": EOT, "pad_token": EOT}, indent=2) + "\n")
    return tok


def export_run(run_dir: str | Path, out_dir: str | Path, corpus=None, log=print) -> Path:
    """Export ``run_dir``'s newest good checkpoint to ``out_dir``; returns ``out_dir``."""
    from ..eval.final import load_trained

    model, cfg, corpus, ckpt = load_trained(run_dir, corpus, log)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    eot = corpus.eot_id
    hf_cfg = BasecapConfig(basecap=json.loads(model.cfg.model_dump_json()), bos_token_id=None, eos_token_id=eot, pad_token_id=eot)
    hf = BasecapForCausalLM(hf_cfg, lm=model)
    hf.generation_config = GenerationConfig(eos_token_id=eot, pad_token_id=eot, do_sample=False)
    hf.save_pretrained(str(out), max_shard_size="1000GB")  # one model.safetensors
    export_tokenizer(corpus.tokenizer_path, out, model.cfg.max_seq_len)
    run_info = RunDir(run_dir).read_info()
    provenance = {
        "run_id": cfg.run_id,
        "checkpoint": ckpt.name,
        "corpus": corpus.dir.name,
        "trained_with_commit": run_info.get("git_commit"),
        "basecap_commit": environment_info(torch.device("cpu"))["git_commit"],
    }
    atomic_write(out / "basecap_export.json", json.dumps(provenance, indent=1) + "\n")
    log(f"[{cfg.run_id}] exported {ckpt.name} to {out}")
    return out
