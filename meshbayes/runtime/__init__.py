"""What every run stands on, whatever it runs: the run lock, preemption signals, atomic
files, console lines, host memory settings, multi-process start-up, the metrics
writer, gin file checks and the old import paths. Imports nothing of training or
evaluation.
"""
