"""Scaling studies: ahead-of-time compiles of the trainer's train step on TPU topologies
and simulated CPU meshes, with per-device memory, fit, FLOPs and collectives.

- ``targets``: TPU topology names and ``cpu:N``, their devices and usable memory.
- ``aot``: the step spec and ``compile_step`` (one record per target).
- ``hlo``: matmul FLOPs and the collective census of compiled HLO, loops unrolled.
- ``hlo_profile``: replica groups and HBM bytes by kind of work of compiled HLO (a GPU's
  kernels among them), per step.
- ``roofline``: predicted step times from peak rates; ``kernels``: a GPU program's
  kernels of avoidable work (unfused attention, copies, transposes, casts).
- ``search``: the largest model of a family that fits a target.
- ``report``: markdown tables and log-log plots.

Import ``targets`` first and call ``prepare_libtpu`` (TPU targets) or set the
CPU device count (CPU targets) before JAX starts; ``tools/scaling_study.py``
does both.
"""
