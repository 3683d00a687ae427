"""Scaling studies: ahead-of-time compiles of the trainer's train step for TPU, GPU and
simulated CPU targets, and what they cost per device (docs/scaling.md lists the modules).

Import ``targets`` first and call ``prepare_libtpu`` (TPU targets) or set the CPU device
count (CPU targets) before JAX starts; ``tools/scaling_study.py`` does both.
"""
