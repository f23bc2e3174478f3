"""``basecap plan EXPERIMENT``: size every run of an experiment before launching it, on this CPU or on GPUs.

On a machine without CUDA and without ``--gpus``/``--gpu-type``, the plan is for this CPU: each run's training
and evaluation tokens over a measured or published training rate (``cpu``; docs/scaling.md). For GPUs, each run's
model is built on the meta device (no memory, no compute) and read for parameter counts and FLOPs per token
(``sizes``); memory per GPU and wall time follow from the formulas in docs/scaling.md (``gpu``): model states (fp32
weights, gradients and AdamW moments: 16 bytes/param, sharded over the GPUs with FSDP), communication buffers,
activations of one micro-batch under bf16 autocast, and a fixed reserve; time = training FLOPs / (GPUs x peak bf16
FLOP/s x MFU). ``experiment`` plans every run of an experiment file, ``table`` prints the plan.
"""

from .cpu import plan_run_cpu
from .experiment import plan_experiment
from .gpu import GPUS, plan_run
from .sizes import run_vocab
from .table import format_plan

__all__ = ["GPUS", "format_plan", "plan_experiment", "plan_run", "plan_run_cpu", "run_vocab"]
