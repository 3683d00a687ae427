"""Bayesian PlaNet in miniature: a latent-dynamics agent on a pendulum seen through pixels.

PlaNet (Hafner et al. 2018) learns a recurrent state-space model (RSSM) of image
observations and plans in its latent space with the cross-entropy method; the Bayesian
variant (Bayesian Layers, Tran et al. 2019, Figures 10-11) turns the transition's Dense
layers into ``DenseReparameterization`` and nothing else.

Modules, one concern each: ``pendulum`` (the environment's dynamics), ``render`` (its
observations as images), ``config`` (the settings), ``model`` (the world model),
``planner`` (CEM), ``agent`` (collection and training), ``probes`` (open-loop prediction
and the linear read-out of the velocity), ``report`` (JSON and figures). The command line
is ``python -m meshbayes.tools.planet`` (``make planet``; docs/planet.md).
"""
