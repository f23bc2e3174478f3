"""Hugging Face interop: importing this package registers ``model_type = "basecap"`` with
``AutoConfig`` and ``AutoModelForCausalLM`` (no ``trust_remote_code``), so an exported run loads with
``AutoModelForCausalLM.from_pretrained(folder)`` and runs under lm-evaluation-harness's ``hf`` model."""

from __future__ import annotations

from transformers import AutoConfig, AutoModelForCausalLM

from .export import export_run
from .modeling import BasecapCache, BasecapConfig, BasecapForCausalLM

AutoConfig.register(BasecapConfig.model_type, BasecapConfig, exist_ok=True)
AutoModelForCausalLM.register(BasecapConfig, BasecapForCausalLM, exist_ok=True)

__all__ = ["BasecapCache", "BasecapConfig", "BasecapForCausalLM", "export_run"]
