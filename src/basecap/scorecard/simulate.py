"""The family's error control, shown by simulation: the chance of any false verdict ('holds' or 'fails') when every
claim sits on the boundary of one of its nulls (the least favourable configurations), through the scorecard's own
tests (``claim_tests``) and family (``family_adjust``). ``basecap scorecard --simulate N`` writes
``results/error_control.json``; SCORECARD.md quotes it (docs/metrics.md, "One statement of error control").

Configurations (each claim's true gap; its seed count and seed sd are the published claim's, or 5 seeds and the
family's median sd for a claim that has not run; claims not run at the CPU scale count with p = 1, as in the
scorecard; so do the claims whose test is not a t-test over seeds, the principle's bootstrap and a speed or accuracy
claim's Welch or proportions test, listed in ``not_simulated``):
- ``holds_boundary``: every claim where a false 'holds' is likeliest: a direction's gap 0, a no-effect gap at the
  margin, a small harm's gap 0;
- ``fails_boundary``: where a false 'fails' is likeliest: a direction's gap at the margin, a no-effect gap just
  inside it, a small harm's just above 0;
- ``mixed``: the claims alternate between the two (both kinds of error possible at once, which two separate Holm
  runs at alpha each do not control: the old rule is simulated beside it);
- ``undeclared_look``: ``holds_boundary`` where every claim is looked at 3 seeds, extended to 5 only if undecided and
  read at 5 by Bonferroni over the two looks (the reading the scorecard gives studies with ``looks_taken``).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np

from ..report.stats import holm
from .verdicts import claim_tests, family_adjust

CONFIGS = ("holds_boundary", "fails_boundary", "mixed", "undeclared_look")


def _truth(c: SimpleNamespace, where: str) -> float:
    m = c.margin
    if c.expect == "no_effect":
        return m if where == "holds" else m * (1 - 1e-6)
    if c.expect == "small":
        return 0.0 if where == "holds" else 1e-9
    return 0.0 if where == "holds" else c.sign * m


def _false(c: SimpleNamespace, delta: float, verdict: str) -> bool:
    """Whether ``verdict`` is false for a claim whose true gap is ``delta`` (nulls as in verdicts: a claim's holds null
    and fails null exclude each other)."""
    m, s = c.margin, c.sign
    if c.expect == "no_effect":
        return abs(delta) >= m if verdict == "holds" else abs(delta) < m
    if c.expect == "small":
        inside = 0 < delta < m
        return not inside if verdict == "holds" else inside
    return s * delta <= 0 if verdict == "holds" else s * delta >= m  # fails: an effect of the margin's size ruled out


def _family(card: dict) -> list[SimpleNamespace]:
    fam = [r for r in card["claims"] if r["family"]]
    sds = [r["test"]["sd"] for r in fam if r.get("test") and r["test"].get("sd")]
    median = float(np.median(sds)) if sds else 0.04
    out = []
    for r in fam:
        t = r.get("test") or {}
        if r.get("kind") == "principle" or t.get("method") in ("bootstrap", "welch", "proportions"):
            t = {}  # not a one-sample t-test over seeds: simulated as not run (p = 1), listed in not_simulated
        sign = {"worse": 1, "small": 1, "rises": 1, "larger": 1, "better": -1, "falls": -1, "smaller": -1}.get(r["direction"] or r["expect"] or "", 0)
        out.append(
            SimpleNamespace(
                id=r["id"],
                expect=r["expect"],
                sign=sign,
                run=t.get("n", 0) >= 2,
                simulated=r.get("kind") != "principle" and (r.get("test") or {}).get("method") not in ("bootstrap", "welch", "proportions"),
                n=t.get("n") or 5,
                sd=t.get("sd") or median,
                margin=t.get("margin") or card["margin"],
            )
        )
    return out


def _one(claims: list[SimpleNamespace], deltas: list[float], rng: np.random.Generator, alpha: float, look: bool, old_rule: bool) -> bool:
    pairs = []
    for c, d in zip(claims, deltas):
        if not c.run:
            pairs.append((1.0, 1.0))
            continue
        n = max(c.n, 5) if look else c.n
        values = list(rng.normal(d, c.sd, n))
        if look:  # a look at 3: if it decides alone (nominal, at the family's first level) the claim stops there
            first = claim_tests(c, values[:3], c.margin)
            if min(first["p_holds"], first["p_fails"]) <= alpha / len(claims):
                pairs.append((min(1.0, 2 * first["p_holds"]), min(1.0, 2 * first["p_fails"])))
                continue
        t = claim_tests(c, values, c.margin)
        k = 2 if look else 1
        pairs.append((min(1.0, k * t["p_holds"]), min(1.0, k * t["p_fails"])))
    if old_rule:
        ph, pf = holm([p[0] for p in pairs]), holm([p[1] for p in pairs])
        adj = [(h, f) for h, f in zip(ph, pf)]
    else:
        adj = [(a[0], a[1]) for a in family_adjust(pairs)]
    for c, d, (h, f) in zip(claims, deltas, adj):
        if c.run and h is not None and h <= alpha and _false(c, d, "holds"):
            return True
        if c.run and f is not None and f <= alpha and _false(c, d, "fails"):
            return True
    return False


def simulate(card: dict, n_sim: int = 1000, seed: int = 0) -> dict:
    """The chance of any false verdict in each configuration (and under the old rule of two Holm runs, for the
    mixed one), with its binomial standard error."""
    claims = _family(card)
    alpha = card["alpha"]
    rng = np.random.default_rng(seed)
    runs = [
        ("holds_boundary", ["holds"] * len(claims), False, False),
        ("fails_boundary", ["fails"] * len(claims), False, False),
        ("mixed", ["holds" if i % 2 == 0 else "fails" for i in range(len(claims))], False, False),
        ("mixed, old rule (two Holm runs at alpha)", ["holds" if i % 2 == 0 else "fails" for i in range(len(claims))], False, True),
        ("undeclared_look", ["holds"] * len(claims), True, False),
    ]
    out = []
    for name, where, look, old in runs:
        deltas = [_truth(c, w) for c, w in zip(claims, where)]
        hits = sum(_one(claims, deltas, rng, alpha, look, old) for _ in range(n_sim))
        rate = hits / n_sim
        out.append(
            {"configuration": name, "any_false": rate, "se": math.sqrt(max(rate * (1 - rate), 1e-12) / n_sim), "rule": "old" if old else "family"}
        )
    family_only = [c for c in out if c["rule"] == "family"]
    return {
        "alpha": alpha,
        "n_sim": n_sim,
        "seed": seed,
        "family_size": len(claims),
        "claims_run": sum(c.run for c in claims),
        "not_simulated": [c.id for c in claims if not c.simulated],
        "configurations": family_only,
        "old_rule": [c for c in out if c["rule"] == "old"],
    }
