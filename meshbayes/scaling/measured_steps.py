"""Train steps measured on one NVIDIA H200, which fix and check the frozen GPU step-time models.

``H200_STEPS``: shared measurement ``h200-2026-11`` (2026-11-26), the fastest timed round
of the trainer's step at commit ``MEASURED_COMMIT``, JAX 0.11.2 (CUDA 13), as
``MeasuredStep.spec_fields`` sets it up. ``roofline.FROZEN_GPU_MODEL`` was fitted on
``base_det_none`` and ``paper_det_full``; ``tools/gpu_model_check.py`` checks its
predictions against these. ``H200_GPU_SHAPE_STEPS``: steps of the GPU shape measured later
with ``tools/gpu_check.py``, each at its own commit. All are ``MEASURED_H200_STEPS``.
"""

from __future__ import annotations

import dataclasses

MEASURED_COMMIT = "56c213e"


@dataclasses.dataclass(frozen=True)
class MeasuredStep:
  """One measured train step.

  Attributes:
    name: ``PRESET_KIND_REMAT`` (``base_det_none``).
    preset: the model preset.
    deterministic: the deterministic twin, else the Bayesian layers.
    batch_size: sequences per step.
    length: input and target tokens per sequence.
    remat: the ``remat_policy``.
    seconds: the fastest measured step.
    traced_matmul_flops: the step's matmul FLOPs as traced (recompute included).
    overrides: further ``TransformerConfig`` fields it was measured with.
    commit: the project's code that was measured.
  """

  name: str
  preset: str
  deterministic: bool
  batch_size: int
  length: int
  remat: str
  seconds: float
  traced_matmul_flops: float
  overrides: tuple[tuple[str, object], ...] = ()
  commit: str = MEASURED_COMMIT

  def spec_fields(self) -> dict:
    """``scaling.aot.StepSpec`` fields of the step as it was measured."""
    return {"model": self.preset, "deterministic": self.deterministic, "optimizer": "adamw",
            "batch_size": self.batch_size, "input_length": self.length,
            "target_length": self.length, "model_parallel": 1, "partitioning": "data_only",
            "num_train_units": 1e6,
            "overrides": (("dtype", "bfloat16"), ("remat_policy", self.remat),
                          *self.overrides)}


H200_STEPS = (
    MeasuredStep("base_det_none", "base", True, 32, 256, "none", 0.0809, 1.1650e13),
    MeasuredStep("base_bayes_none", "base", False, 32, 256, "none", 0.1522, 2.1391e13),
    MeasuredStep("paper_det_full", "paper", True, 8, 256, "full", 0.1615, 4.5758e13),
    MeasuredStep("paper_bayes_full", "paper", False, 8, 256, "full", 0.3817, 9.1937e13),
    # Measured alone (the Bayesian step beside it ran out of memory); not used in the fit.
    MeasuredStep("paper_det_none", "paper", True, 8, 256, "none", 0.1642, 3.6893e13),
)

# tools/gpu_check.py --presets=paper_gpu --kinds=deterministic on a lent H200 on 2026-11-27
# (JAX 0.11.2, fastest of 3 rounds; docs/results/2026-11-27-gpu.md): layers unrolled, XLA
# attention with attention-weight dropout 0.1, no fused attention.
H200_GPU_SHAPE_STEPS = (
    MeasuredStep("paper_det_unrolled_16", "paper", True, 16, 256, "none", 0.2091, 7.3785e13,
                 overrides=(("scan_layers", False),), commit="b53958b"),
)
MEASURED_H200_STEPS = H200_STEPS + H200_GPU_SHAPE_STEPS
