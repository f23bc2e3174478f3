"""``summary.json``: a report's result in a form a program can check.

    {"study", "size", "commit", "reference", "smooth", "near_unigram",
     "runs": [{"name", "seeds", "in_domain_loss", "unigram_loss", "context_gain", "ood": {domain: loss}, ...}],
     "comparisons": [{"run", "reference", "domain", "n_seeds", "per_seed", "mean_gap", "ci95", "p", "p_holm",
                      "ci_simultaneous", "verdict", ...}],
     "in_domain_comparisons": [{"run", "reference", "n_seeds", "seeds", "per_seed", "mean_diff", "sd", "ci95",
                                "p", "p_holm", "notes"}]}

Losses are means over seeds; ``unigram_loss`` is the unigram baseline's in-domain loss and
``context_gain`` = unigram_loss - in_domain_loss; gaps are the primary endpoint (docs/metrics.md). ``in_domain_comparisons``: final
in-domain loss minus the reference's, paired by seed (not at matched loss).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .runs import Run

EXPERIMENT_FILE = "experiment.json"  # written by ``basecap run`` next to the run directories


def study_of(run_dirs: list[Path]) -> tuple[str | None, str | None]:
    """(study name, size) from the experiment file beside the run directories, else (their common folder's
    name, None)."""
    parents = {Path(d).resolve().parent for d in run_dirs}
    if len(parents) == 1:
        parent = parents.pop()
        try:
            exp = json.loads((parent / EXPERIMENT_FILE).read_text(encoding="utf-8"))
            return exp.get("name"), exp.get("size")
        except (OSError, ValueError):
            return parent.name, None
    return None, None


def _commit(runs: list[Run]) -> tuple[str | None, dict]:
    """The code commit shared by every run (None when they differ), and each run's commit, dirty flag, wall-clock
    seconds (run.json's "wall", where the run recorded it) and, for a run copied from another study with
    ``--reuse``, where it came from."""
    each = {
        r.run_id: {
            "commit": r.info.get("git_commit"),
            "dirty": r.info.get("git_dirty"),
            **({"wall_s": r.info["wall"]["seconds"]} if (r.info.get("wall") or {}).get("sessions") else {}),
            **({"reused_from": r.info["reused_from"]} if r.info.get("reused_from") else {}),
        }
        for r in runs
    }
    commits = {v["commit"] for v in each.values()}
    return (commits.pop() if len(commits) == 1 else None), each


def _mean(ms: tuple | None) -> float | None:
    return ms[0] if ms else None


def _sd(ms: tuple | None) -> float | None:
    return ms[1] if ms else None


def _run_entry(name: str, row: dict, domains: list[str]) -> dict:
    """One run name of the final table: losses are means over seeds (with their sd where useful)."""
    base = row.get("unigram")
    return {
        "name": name,
        "seeds": row["seeds"],
        "steps": row["steps"],
        "params": row["params"],
        "in_domains": row["in_domains"],
        "in_domain_loss": _mean(row["in_domain_loss"]),
        "in_domain_loss_sd": _sd(row["in_domain_loss"]),
        "unigram_loss": base["in_domain"] if base else None,
        "context_gain": _mean(row["context_gain"]),
        "context_gain_sd": _sd(row["context_gain"]),
        "ood": {d: row[d]["loss"][0] for d in domains if d in row and d not in row["in_domains"]},
        "domains": {
            d: {"loss": row[d]["loss"][0], "bpb": row[d]["bpb"][0], "unigram_loss": base["domains"].get(d) if base else None}
            for d in domains
            if d in row
        },
    }


def build_summary(summary: dict, runs: list[Run], study: str | None, size: str | None) -> dict:
    """The summary.json object of a report (``summary`` from ``report.core.summarize``)."""
    commit, commits = _commit(runs)
    return _finite(
        {
            "study": study,
            "size": size,
            "commit": commit,
            "commits": commits,
            "reference": summary["reference"],
            "references": summary["references"],
            "smooth": summary["smooth"],
            "near_unigram": summary["near_unigram"],
            "runs": [_run_entry(n, row, summary["domains"]) for n, row in summary["final"].items() if row["in_domain_loss"]],
            "comparisons": summary["comparisons"],
            "in_domain_comparisons": summary.get("in_domain_comparisons", []),
            **{k: summary[k] for k in ("design", "comparisons_by_measure", "interactions", "strata_shares", "reach") if k in summary},
        }
    )


def _finite(obj: Any) -> Any:
    """NaN and infinities become null, so the file is strict JSON."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj
