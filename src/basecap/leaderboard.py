"""``basecap leaderboard``: every architecture basecap has published results for, one row each, written to
``results/LEADERBOARD.md`` (docs/compare.md, "The leaderboard").

The rows are read, not recomputed: each architecture claim of the scorecard (a run against Transformer++ with a loss
gap, from ``results/scorecard.json``: the study that answers it, the gap over its seeds and each domain's, its rate
arms where they are published, its verdict), Transformer++ itself (the anchor: its gap is 0 by definition) and every
architecture added with ``basecap compare`` (``results/*/compare.json``: the same readings, its verdict over the arms).
Beside the gap: the parameter counts and in-domain loss of the run's records, MQAR accuracy (the principle's
measurement, ``scorecard.json``; a compared architecture's own), the decoding state at 2048 tokens and the cost
string (``LM.state_size`` and the mixer's declared ``cost()`` for the trained config), and the training tokens per
second on the CPU the runs trained on (the median over seeds of each run's ``speed``, with its thread count).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from .report.stats import paired_test

LEADERBOARD = Path("results/LEADERBOARD.md")
FIGURE = "principle_mqar_vs_gap.png"  # drawn by `basecap scorecard --figures` beside LEADERBOARD.md
REFERENCE = "transformer_pp"
STATE_AT = 2048
PAIR_EXPECTS = ("worse", "better", "no_effect", "small")

# sort keys: column -> (row value, descending); rows without a value go last
SORTS = {
    "gap": ("gap", False),
    "docs": ("docs", False),
    "code": ("code", False),
    "arm_a": ("arm_a", False),
    "arm_b": ("arm_b", False),
    "mqar": ("mqar", True),
    "state": ("state_bytes", False),
    "speed": ("tokens_per_s", True),
    "params": ("params", False),
    "in_domain": ("in_domain_loss", False),
    "name": ("label", False),
}


def _json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _interval(values: list[float]) -> dict:
    t = paired_test(values)
    return {"n": t.n, "mean": t.mean, "ci95": list(t.ci95) if t.ci95 else None}


def _records(results: Path, run: str) -> list[dict]:
    """The run.json of every seed of ``run`` in a published study."""
    return [r for p in sorted((results / "runs").glob(f"{run}-s*/run.json")) if (r := _json(p)) is not None and r["config"]["name"] == run]


def _model_facts(config: dict) -> dict:
    """Decoding state at STATE_AT tokens and the declared cost of a trained run's model config."""
    import torch

    from .mixers import build_mixer
    from .model import LM, ModelConfig

    try:
        with torch.device("meta"):
            lm = LM(ModelConfig.model_validate(config["model"]))
    except Exception as e:  # noqa: BLE001 - a mixer this code no longer has (or a file's, not imported): say so, keep the row
        return {"state_note": f"not built here ({type(e).__name__})"}
    s = lm.state_size(STATE_AT)
    with torch.device("meta"):
        mixer = build_mixer(lm.cfg.mixer, lm.cfg.d_model, 0, lm.cfg.max_seq_len)
    return {"state_bytes": s, "state_grows": s != lm.state_size(STATE_AT // 2), "cost": mixer.cost(STATE_AT)}


def _from_records(results: Path, run: str) -> dict:
    """Parameters, in-domain loss, CPU training speed, state and cost of a run of a published study."""
    recs = _records(results, run)
    out: dict = {}
    if not recs:
        return out
    out["params"] = recs[0].get("params", {}).get("total")
    out["params_non_embedding"] = recs[0].get("params", {}).get("non_embedding")
    speeds = [r["speed"]["tokens_per_s"] for r in recs if (r.get("speed") or {}).get("tokens_per_s") and r.get("device", {}).get("type") == "cpu"]
    if speeds:
        out["tokens_per_s"] = statistics.median(speeds)
        out["threads"] = sorted({r["device"].get("threads") for r in recs if r.get("device")} - {None})
    summary = _json(results / "summary.json") or {}
    out["in_domain_loss"] = next((r.get("in_domain_loss") for r in summary.get("runs", []) if r.get("name") == run), None)
    out.update(_model_facts(recs[0]["config"]))
    return out


def _claim_row(c: dict, labels: dict[str, dict], root: Path) -> dict:
    t = c.get("test") or {}
    parts = (c.get("parts") or {}).get(f"{c['run']} vs {c['reference']}", {})
    row = {
        "label": labels.get(c["run"], {}).get("label", c["run"]),
        "run": c["run"],
        "source": f"claim `{c['id']}`",
        "study": c.get("results"),
        "seeds": len(c.get("seeds") or []),
        "gap": t.get("mean"),
        "gap_ci": t.get("ci95"),
        "verdict": c.get("verdict"),
        "robust": c.get("robust"),
        "breaks": list(c.get("breaks") or []),
    }
    for d, per_seed in parts.items():
        iv = _interval(list(per_seed.values()))
        row[d], row[f"{d}_ci"] = iv["mean"], iv["ci95"]
    for arm in c.get("arms") or []:
        key = "arm_a" if arm["label"].startswith("A") else "arm_b" if arm["label"].startswith("B") else None
        if key and arm.get("test"):
            row[key], row[f"{key}_ci"] = arm["test"].get("mean"), arm["test"].get("ci95")
        elif key:
            row[f"{key}_note"] = "waiting"
    mq = labels.get(c["run"], {}).get("mqar")
    if mq:
        row["mqar"] = mq.get("mean")
    if row["study"]:
        row.update(_from_records(root / "results" / row["study"], c["run"]))
    return row


def _compare_row(path: Path, root: Path) -> dict:
    r = json.loads(path.read_text(encoding="utf-8"))
    arms = {a["arm"]: a for a in r["arms"]}
    tuned = arms.get("tuned", {})
    row = {
        "label": r["architecture"],
        "run": r["architecture"],
        "source": f"`basecap compare` ({r['study']})",
        "study": path.parent.name,
        "seeds": tuned.get("n", 0),
        "gap": tuned.get("gap"),
        "gap_ci": tuned.get("ci95"),
        "verdict": r["overall"]["verdict"],
        "mqar": (r.get("mqar") or {}).get("mean"),
    }
    rb = r.get("robustness")
    if rb is not None:  # the choices that give another verdict: an arm's own reading, a specification in any arm
        v = row["verdict"]
        other = [f"arm {a['arm']}" for a in r["arms"] if a["verdict"] != v]
        other += [s["spec"] for a in r["arms"] for s in a.get("specs", []) if s["verdict"] not in ("n/a", v)]
        row["robust"], row["breaks"] = rb["robust"], list(dict.fromkeys(other))
    for d, iv in (tuned.get("domains") or {}).items():
        row[d], row[f"{d}_ci"] = iv.get("gap"), iv.get("ci95")
    for key, arm in (("arm_a", "A"), ("arm_b", "B")):
        if arm in arms:
            row[key], row[f"{key}_ci"] = arms[arm].get("gap"), arms[arm].get("ci95")
    row.update(_from_records(path.parent, r["architecture"]))
    row.update({k: r[k] for k in ("state_bytes", "state_grows", "cost") if r.get(k) is not None})
    return row


def build_rows(root: str | Path = ".") -> list[dict]:
    """Every architecture's row (see the module's docstring), in no particular order."""
    root = Path(root)
    card = _json(root / "results" / "scorecard.json") or {}
    points = (card.get("principle") or {}).get("points") or []
    labels = {p["run"]: p for p in points if p.get("reference") == REFERENCE}
    rows = []
    anchor = labels.get(REFERENCE)
    if anchor is not None:
        row = {"label": anchor["label"], "run": REFERENCE, "source": "the reference", "study": anchor["study"], "gap": 0.0, "verdict": "reference"}
        row["mqar"] = (anchor.get("mqar") or {}).get("mean")
        row.update(_from_records(root / "results" / anchor["study"], REFERENCE))
        rows.append(row)
    for c in card.get("claims", []):
        if c.get("reference") == REFERENCE and c.get("expect") in PAIR_EXPECTS and c.get("metric", "ood_gap") == "ood_gap" and c.get("run"):
            if not c.get("gpu_family") and c["run"] not in {r["run"] for r in rows}:
                rows.append(_claim_row(c, labels, root))
    for path in sorted((root / "results").glob("*/compare.json")):
        rows.append(_compare_row(path, root))
    return rows


def sort_rows(rows: list[dict], by: str = "gap") -> list[dict]:
    """Rows sorted by a column of ``SORTS`` (rows without a value last, then by name)."""
    if by not in SORTS:
        from .config_base import ConfigError

        raise ConfigError(f"--sort: unknown column {by!r}; allowed: {', '.join(SORTS)}")
    key, descending = SORTS[by]
    have = sorted((r for r in rows if r.get(key) is not None), key=lambda r: (r[key], r["label"]), reverse=descending)
    return have + sorted((r for r in rows if r.get(key) is None), key=lambda r: r["label"])


def _gap(v: float | None, ci: list[float] | None = None, note: str | None = None) -> str:
    if v is None:
        return note or "-"
    return f"{v:+.3f}" + (f" [{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else "")


def _bytes(row: dict) -> str:
    s = row.get("state_bytes")
    if s is None:
        return row.get("state_note", "-")
    text = f"{s / 2**20:.2f} MiB" if s >= 2**20 else f"{s / 2**10:.1f} KiB"
    return text + (" (grows)" if row.get("state_grows") else "")


def _verdict(row: dict) -> str:
    """The verdict and what it survives: *robust* when every specification gives it, else the choices that do not."""
    v = row.get("verdict") or "-"
    if row.get("breaks"):
        return f"{v}, not under {', '.join(row['breaks'])}"
    return f"{v}, robust" if row.get("robust") else v


def leaderboard_markdown(rows: list[dict], by: str = "gap", figure: bool = False) -> str:
    rows = sort_rows(rows, by)
    domains = [d for d in ("docs", "code") if any(d in r for r in rows)] or ["docs", "code"]
    figure_line = (
        f"![selection ability against OOD gap]({FIGURE})"
        if figure
        else f"The figure \"selection ability against OOD gap\" (`{FIGURE}`, `basecap scorecard --figures`) is not yet drawn."
    )
    lines = [
        "# Leaderboard: every architecture against Transformer++",
        "",
        "<!-- generated by `basecap leaderboard` from results/scorecard.json, results/*/compare.json and the runs' records; do not edit -->",
        "",
        "One row per architecture with published results. **gap**: OOD loss minus Transformer++'s at matched in-domain loss "
        "(nats/token, the mean of the held-out domains, the study's primary measure; positive = worse), over the seeds, with its "
        "95% t interval; **docs** / **code**: each domain's; **arm A**: both at Transformer++'s learning rate; **arm B**: both at "
        "the architecture's tuned rate (`-`: no such arm, *waiting*: not published yet); **verdict**: the scorecard's for a claim of "
        "the paper, `basecap compare`'s (over the arms) for an architecture added with it; *robust* when every specification "
        "(every target instead of the seen ones, the band at the lowest common level, at half of training, each rate arm) gives "
        "it, else *not under* the choices that give another. **MQAR**: accuracy at 8 key-value pairs "
        "on the principle's protocol (mean over its seeds; `-`: not measured yet). **state**: one sequence's decoding state at "
        f"{STATE_AT} tokens (fp32). **tok/s**: training tokens per second on the CPU the runs trained on (median over seeds; "
        "threads in brackets). Rows sorted by "
        f"{by} (`basecap leaderboard --sort {'|'.join(SORTS)}`).",
        "",
        "| architecture | params (non-emb.) | in-domain | gap [95% CI] | "
        + " | ".join(domains)
        + " | arm A | arm B | verdict | MQAR | state | tok/s | cost | study | seeds |",
        "|---|---|---|---|" + "---|" * len(domains) + "---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        params = f"{r['params'] / 1e6:.2f}M ({r['params_non_embedding'] / 1e6:.2f}M)" if r.get("params") else "-"
        speed = f"{r['tokens_per_s']:,.0f} ({','.join(map(str, r.get('threads', [])))})" if r.get("tokens_per_s") else "-"
        cells = [
            r["label"],
            params,
            f"{r['in_domain_loss']:.3f}" if r.get("in_domain_loss") is not None else "-",
            _gap(r.get("gap"), r.get("gap_ci")),
            *(_gap(r.get(d), r.get(f"{d}_ci")) for d in domains),
            _gap(r.get("arm_a"), r.get("arm_a_ci"), "*waiting*" if r.get("arm_a_note") else None),
            _gap(r.get("arm_b"), r.get("arm_b_ci"), "*waiting*" if r.get("arm_b_note") else None),
            _verdict(r),
            f"{r['mqar']:.3f}" if r.get("mqar") is not None else "-",
            _bytes(r),
            speed,
            r.get("cost", "-"),
            f"[{r['study']}]({r['study']}/)" if r.get("study") else "-",
            str(r.get("seeds", "-")) if r.get("run") != REFERENCE else "-",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", figure_line, ""]
    return "\n".join(lines)


def write_leaderboard(root: str | Path = ".", by: str = "gap") -> Path:
    """Write ``results/LEADERBOARD.md`` under ``root``; returns its path."""
    from .atomic import atomic_write

    root = Path(root)
    path = root / LEADERBOARD
    text = leaderboard_markdown(build_rows(root), by, figure=(path.parent / FIGURE).is_file())
    atomic_write(path, text)
    return path
