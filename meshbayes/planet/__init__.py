"""Bayesian PlaNet in miniature: a latent-dynamics agent on a pendulum seen through pixels.

PlaNet (Hafner et al. 2018) and its Bayesian variant (Tran et al. 2019, Figures 10-11:
the transition's Dense layers made ``DenseReparameterization``, nothing else).
docs/planet.md describes the modules; the command line is ``python -m
meshbayes.tools.planet`` (``make planet``).
"""
