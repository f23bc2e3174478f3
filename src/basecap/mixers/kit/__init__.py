"""The mixer kit: small parts that several mixers share. A mixer module imports from here and from
``basecap.ops``, never from another mixer module, so each architecture stays one file.

- ``rope``: rotary position tables and their application to q and k
- ``heads``: the q/k/v/o projection block of the softmax-attention family, head split and merge
- ``recurrent``: the short convolution (or its SiLU ablation) with its decode cache, dt-bias and
  A initialisers of the Mamba parameterisation, the "keep my init" marker
- ``delta``: the delta-rule core of DeltaNet and Gated DeltaNet (form dispatch, state)
- ``rwkv``: what the RWKV-5/6/7 time-mixing blocks share (heads, projections, output norm, state)
- ``selection``: the base of the Top-1 selection mixers (config fields, projections, KV cache)

The choice between the reference, chunked and fast forms is one method, ``Mixer.resolve_impl``
(``mixers/base.py``).
"""
