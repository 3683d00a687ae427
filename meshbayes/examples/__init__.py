"""Offline examples of the layer library, each a command that writes a figure and a JSON.

- ``python -m meshbayes.examples.sin_regression``: a Bayesian MLP on 32 noisy
  points of ``10 sin(2 pi x)``; its epistemic band widens away from the data.
- ``python -m meshbayes.examples.lenet_digits``: Bayesian LeNet-5 (Flipout) against
  its deterministic twin on scikit-learn's digits: accuracy, ECE, and predictive
  entropy that tells random-noise images from digits (AUROC).
- ``python -m meshbayes.examples.resnet``: the Bayesian Layers paper's Bayesian
  ResNet-50 counted from shapes alone, and a small ResNet of the same code
  trained on digits.
- ``python -m meshbayes.examples.char_lstm``: the paper's Figure 1, a Bayesian
  LSTM character language model (Flipout cell) against its deterministic twin
  on the English side of Tatoeba (needs ``make data``): perplexity and ECE.
- ``python -m meshbayes.examples.flow_moons``: a RealNVP flow with MADE
  conditioners turns a standard normal into scikit-learn's two moons (test
  log-likelihood against the base Gaussian and a Gaussian mixture).
- ``python -m meshbayes.examples.vqvae_digits``: a VQ-VAE on the digits, its
  codes through a ``VectorQuantizer`` (reconstruction error, codebook usage).
- ``python -m meshbayes.examples.pixel_mixture``: the paper's Figure 6, an
  autoregressive (MADE) model of the digits' pixels with a discretized
  logistic mixture likelihood, in bits per dimension.
- ``python -m meshbayes.examples.deep_gp_diabetes``: the paper's Figure 5, a deep
  Gaussian process of three sparse GP layers on scikit-learn's diabetes data,
  against one sparse GP layer and a Bayesian MLP (test RMSE, log-likelihood).
- ``python -m meshbayes.examples.cox_process``: the paper's Figure 8, a Cox
  process (``PoissonProcess`` with a deep GP rate) on the coal-mining disasters
  and a 2-D pattern of known intensity (held-out log-likelihood against a
  kernel density, L2 error and 90% band coverage).

Each takes ``--output_dir`` and size flags (``--help``); sizes default to the
full run, and the tests run each at toy size.
"""
