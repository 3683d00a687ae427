"""Scaling studies: ahead-of-time compiles of the trainer's train step for TPU, GPU and
simulated CPU targets, and what they cost per device (docs/scaling.md lists the modules);
and the measurements of the train step on this machine (``step_spec``, ``timing``,
``benchmarks``, ``trainer_benchmarks``, ``step_operations``, ``peak_buffers``,
``step_profile``, ``gpu_check``) that ``tools/`` runs as command lines.

Import ``targets`` first and call ``prepare_libtpu`` (TPU targets) or set the CPU device
count (CPU targets) before JAX starts; ``tools/scaling_study.py`` (``study.set_up_jax``) does both.
"""
