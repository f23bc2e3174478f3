"""Thin adapters to optional fast libraries (fla, CUDA paths); imported lazily, never on the CPU path."""
