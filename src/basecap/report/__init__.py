"""Tables and plots from run directories: ``report(run_dirs, out_dir)``."""

from .analysis import matched_gap
from .core import report
from .runs import load_run

__all__ = ["load_run", "matched_gap", "report"]
