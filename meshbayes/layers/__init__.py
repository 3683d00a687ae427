"""Bayesian layers: drop-in flax layers whose weights are normal posteriors.

Each layer keeps its flax twin's constructor and call; ``bayesianize`` makes a
model of flax's own layers Bayesian. ``Normal`` here is the stochastic output
layer (the weight posterior is ``estimators.Normal``). ``docs/layers.md`` lists
every layer, estimator and prior, how the recorded KL enters a loss, and what
adding a layer takes.
"""

import importlib
import types

from meshbayes.layers import estimators
from meshbayes.layers.attention import (
                                    MultiHeadDotProductAttention,
                                    MultiHeadDotProductAttentionFlipout,
                                    MultiHeadDotProductAttentionGroupedReparameterization,
                                    MultiHeadDotProductAttentionLocalReparameterization,
                                    MultiHeadDotProductAttentionReparameterization,
                                    attention_class,
)
from meshbayes.layers.bayesianize import Bayesianized, bayesianize, moped_init
from meshbayes.layers.conv import (
                                    Conv,
                                    ConvFlipout,
                                    ConvLocalReparameterization,
                                    ConvReparameterization,
                                    conv_class,
)
from meshbayes.layers.counting import ParameterCounts, count_parameters
from meshbayes.layers.dense import (
                                    DENSE_ESTIMATORS,
                                    ESTIMATORS,
                                    Dense,
                                    DenseFlipout,
                                    DenseGeneral,
                                    DenseGeneralFlipout,
                                    DenseGeneralGroupedReparameterization,
                                    DenseGeneralLocalReparameterization,
                                    DenseGeneralReparameterization,
                                    DenseGroupedReparameterization,
                                    DenseLocalReparameterization,
                                    DenseReparameterization,
                                    dense_class,
                                    dense_general_class,
)
from meshbayes.layers.embed import (
                                    Embed,
                                    EmbedFlipout,
                                    EmbedLocalReparameterization,
                                    EmbedReparameterization,
                                    embed_class,
)
from meshbayes.layers.initializers import (
                                    constant_stddev,
                                    fan_in_stddev,
                                    softplus_inverse,
)
from meshbayes.layers.lstm import (
                                    RNN,
                                    LSTMCell,
                                    LSTMCellFlipout,
                                    LSTMCellReparameterization,
                                    lstm_cell_class,
)
from meshbayes.layers.kl import KL_COLLECTION, KL_NAME, kl_penalty, total_kl
from meshbayes.layers.moped import moped_params
from meshbayes.layers.poisson_process import (PoissonProcess, PoissonProcessDistribution,
                                              ThinningDiagnostics)
from meshbayes.layers.priors import (
                                    NormalPrior,
                                    Prior,
                                    ScaleMixtureNormalPrior,
                                    TrainableNormalPrior,
                                    normal_kl,
)
from meshbayes.layers.posteriors import (
                                    LayerWeights,
                                    Posterior,
                                    as_posterior,
                                    dropout_rngs,
                                    holds_posterior,
                                    posterior_mean,
                                    sample_axes,
                                    sample_weights,
)
from meshbayes.layers.variational import SAMPLE_RNG, posterior_part
from meshbayes.layers.weight_posterior import Ensemble, MCDropout, WeightPosterior
from meshbayes.layers.vector_quantization import (
                                    VQ_LOSS_COLLECTION,
                                    VectorQuantizer,
                                    total_vq_loss,
)
from meshbayes.layers.variational_dropout import (
                                    ConvVariationalDropout,
                                    DenseVariationalDropout,
                                    LogUniformPrior,
                                    log_alpha,
                                    log_uniform_kl,
                                    sparsity,
)

# Layers returning TensorFlow Probability distributions load on first use:
# TFP's JAX substrate imports TensorFlow when installed (for docstrings), ~2 s
# that a model without them should not pay.
_LAZY_MODULES = {
    "gaussian_process": ("GaussianProcess", "RandomFourierFeatures", "SparseGaussianProcess",
                         "gaussian_expected_log_likelihood", "optimal_variational_distribution"),
    "reversible": ("MADE", "Flow", "MaskedDense", "RealNVP", "Reverse",
                   "transform_distribution"),
    "stochastic_outputs": ("Bernoulli", "Categorical", "Discretize", "MixtureLogistic",
                           "MixtureNormal", "Normal", "Poisson", "discretize"),
}
_LAZY = {name: module for module, names in _LAZY_MODULES.items() for name in names}


def __getattr__(name: str):
  if name in _LAZY_MODULES:
    return importlib.import_module(f"{__name__}.{name}")
  if name not in _LAZY:
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
  value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
  globals()[name] = value
  return value


# Every public name imported above (submodules aside, but `estimators`), then the lazy ones:
# a layer is exported by its import line alone (tests/layers/test_layer_lists.py checks
# that every public layer class is).
__all__ = [*(name for name, value in globals().items()
             if not name.startswith("_") and not isinstance(value, types.ModuleType)),
           "estimators", *_LAZY]
