"""Tables and plots from run directories: ``report(run_dirs, out_dir)``."""

from .core import load_run, matched_gap, report

__all__ = ["load_run", "matched_gap", "report"]
