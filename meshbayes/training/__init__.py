"""Training: the trainer and its train step, optimizers (IVON among them), the host's
input feed, the grouped run settings, checkpoints, early stopping and the compute log.

``python -m meshbayes.train`` runs ``trainer.train``.
"""
