"""``basecap mixers``' cost column: one cost per Top-1 selection mode, and every cost string's training term
against the scaling exponent ``basecap bench mixers`` measures."""

import math

import pytest

from basecap.catalog import cost_exponent, describe, format_table
from basecap.mixers import mixer_names


def test_cost_strings_parse_into_exponents():
    assert cost_exponent("O(T^2) train, O(T) per decoded token", 2048, 8192) == pytest.approx(2.0)
    assert cost_exponent("O(T^2) train, O(T) per decoded token", 2048, 8192, part="decode") == pytest.approx(1.0)
    assert cost_exponent("O(T) train, O(1) per decoded token", 512, 4096) == pytest.approx(1.0)
    assert cost_exponent("O(T) train, O(1) per decoded token", 512, 4096, part="decode") == pytest.approx(0.0)
    assert cost_exponent("O(T W) train, O(W) per decoded token", 2048, 8192, window=256) == pytest.approx(1.0)
    # T^2/C + T C at C = 128: 2048 -> 32768 + 262144, 8192 -> 524288 + 1048576
    approx = "O(T^2/C + T C) train, O(T/C + C) per decoded token"
    assert cost_exponent(approx, 2048, 8192, chunk=128) == pytest.approx(math.log(1572864 / 294912) / math.log(4))
    assert cost_exponent(approx, 1024, 16384, chunk=128, part="decode") == pytest.approx(math.log(256 / 136) / math.log(16))


def test_top1_chunk_has_one_cost_per_selection_mode():
    rows = {r["mixer"]: r for r in describe()}
    chunk = rows["top1_chunk"]["cost_by_mode"]
    assert rows["top1_chunk"]["cost_switch"] == "selection"
    assert set(chunk) == {"exact", "approx"} and chunk["exact"] != chunk["approx"]
    assert chunk["exact"].startswith("O(T^2) train") and chunk["approx"].startswith("O(T^2/C + T C) train")
    assert rows["attention"]["cost_by_mode"] is None and rows["attention"]["cost_switch"] is None
    table = format_table(list(rows.values()), "tiny", 2048)
    assert "top1_chunk approx: O(T^2/C + T C) train, O(T/C + C) per decoded token" in table
    assert "top1_chunk exact: O(T^2) train, O(T) per decoded token" in table


SPECS = [*mixer_names(), "top1_chunk:selection=approx", "attention:window=256"]


@pytest.mark.slow
@pytest.mark.parametrize("spec", SPECS)
def test_every_cost_string_matches_a_measured_scaling_exponent(spec):
    """Forward + backward of one layer at T = 2048 and 8192 (d_model 192, one thread, CPU time): the slope of log
    time against log T within 0.4 of the cost string's. Measured (a loaded 2-core machine): quadratic mixers
    1.7-1.9 (projections and other linear work pull them under 2), linear ones 0.95-1.2, Approx 0.97 against
    its predicted 1.21; a quadratic string on a linear form (or the reverse) is off by about 1.

    The band is 0.4 below and 0.6 above: a form that materialises fp32 [B, H, T, T] tensors (forgetting
    attention's decay bias and its mask: about 0.8 GB each at 8192) is memory-bound there and ran at 2.46 on
    another 2-core machine, twice; still far from the 3 a cubic slip would give and from the 1 of a linear form."""
    from basecap.bench.mixers import train_exponent

    def within(got: dict) -> bool:
        return -0.4 <= got["exponent"] - got["predicted"] <= 0.6

    got = train_exponent(spec, (2048, 8192))
    if not within(got):  # Based: 1.46 once beside two training jobs, 1.07-1.11 when measured again
        got = train_exponent(spec, (2048, 8192), reps=4)
    assert within(got), (got["exponent"], got["predicted"], got["cost"], got["times"])
