"""Top-1 Element selection attention (Lu et al. 2025, "How Does Sequence Modeling Architecture
Influence Base Capabilities of Pre-trained Language Models?", arXiv 2505.18522, section 5).

Each query outputs the value at its single highest-scoring visible position,
``o_t = v_{argmax_{i <= t} s_ti}`` with ``s_ti = q_t . k_i / (sqrt(D) * temperature)``; ties go to
the lowest index. The argmax has no gradient, so training uses an estimator (``estimator``):
``straight_through`` (default): weights ``y = onehot(argmax) + p - stopgrad(p)``, ``p = softmax(s)``,
i.e. soft-attention gradients for q and k; ``prob_ratio``: ``o_t = (p_i* / stopgrad(p_i*)) v_i*``.
Projections, heads (head_dim 64) and RoPE as in Transformer++ (``kit/selection.py``).

``impl="ref"``: dense T x T fp32 scores (the oracle, ``ops/top1/naive.py``). ``"chunked"``: blockwise
over query blocks of ``chunk_size`` rows with a hand-written backward (memory O(chunk_size * T),
``ops/top1/element.py``). ``"fast"``: the same on CUDA with larger blocks
(``basecap.kernels.top1_cuda``). See docs/top1.md.
"""

from __future__ import annotations

from typing import Literal

from ..ops.top1 import element_ref, top1_element
from .kit.selection import SelectionConfig, SelectionMixer


class Top1ElementConfig(SelectionConfig):
    name: Literal["top1_element"] = "top1_element"
    estimator: Literal["straight_through", "prob_ratio"] = "straight_through"


class Top1Element(SelectionMixer):
    config_class = Top1ElementConfig
    cfg: Top1ElementConfig
    impls = ("ref", "chunked")
    out_projections = ("o_proj",)
    match_field = None
    compiles = True
    test_variants = [
        {"head_dim": 8, **switches}
        for switches in (
            {},
            {"estimator": "prob_ratio"},
            {"position": "none", "temperature": 0.5},
        )
    ]

    def _mix(self, q, k, v, q_pos, impl, state, new_state):
        if impl == "ref":
            return element_ref(q, k, v, q_pos, self.scale, self.cfg.estimator)
        return top1_element(q, k, v, q_pos, self.scale, self._block_rows(impl, self.cfg.chunk_size), self.cfg.estimator)

    def flops_per_token(self, seq_len: int) -> float:
        # scores q.k over the (T+1)/2 visible keys on average; the output is a gather
        return 2 * self.n_heads * self.head_dim * (seq_len + 1) / 2
