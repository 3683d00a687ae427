"""Bayesian drop-ins for ``nn.LSTMCell``, one class per estimator, and the ``RNN`` that scans them.

A cell's eight dense maps are Bayesian ``Dense`` layers of its estimator. Scan
with ``RNN`` (``nn.RNN`` with the ``'sample'`` rng unsplit and the KL recorded)
so a sequence keeps one weight sample at every step; a plain ``nn.RNN`` raises
for want of a ``'sample'`` rng and drops the KL.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax.core import FrozenDict

from meshbayes.layers.dense import dense_class
from meshbayes.layers.initializers import constant_stddev, fan_in_stddev
from meshbayes.layers.kl import KL_COLLECTION
from meshbayes.layers.priors import NormalPrior, Prior
from meshbayes.layers.variational import SAMPLE_RNG, use_posterior_mean

Array = jax.Array
Initializer = Callable[..., Any]
Axes = tuple[str | None, ...] | None

LSTM_ESTIMATORS = ("deterministic", "reparameterization", "flipout")


class _LSTMCell(nn.RNNCellBase):
  """The shared body of the LSTM cells; subclasses pick the estimator.

  Attributes:
    features: number of output (hidden) features.
    gate_fn: activation of the gates (sigmoid).
    activation_fn: activation of the output and memory update (tanh).
    kernel_init: initializer of the input kernels' posterior means.
    recurrent_kernel_init: initializer of the hidden-state kernels' means.
    bias_init: initializer of the biases (of their means, if Bayesian).
    dtype: computation dtype (default: inferred from inputs and parameters).
    param_dtype: parameter dtype (float32).
    carry_init: initializer of the carry.
    kernel_axes: logical axes of the input kernels ``(input, hidden)``.
    recurrent_kernel_axes: logical axes of the hidden-state kernels
      ``(hidden, hidden)``; the first is unsharded by default, as one name
      cannot shard two dimensions of one array.
    bias_axes: logical axes of the biases.
    kernel_stddev_init: initializer of the kernels' posterior stddevs.
    bias_stddev_init: initializer of a Bayesian bias's stddev.
    bayesian_bias: give the biases a normal posterior too.
    prior: prior of every Bayesian weight of the cell.
    deterministic: use the posterior mean; the call argument overrides it.
  """

  features: int
  gate_fn: Callable[..., Any] = nn.sigmoid
  activation_fn: Callable[..., Any] = nn.tanh
  kernel_init: Initializer = nn.initializers.lecun_normal()
  recurrent_kernel_init: Initializer = nn.initializers.orthogonal()
  bias_init: Initializer = nn.initializers.zeros_init()
  dtype: Any = None
  param_dtype: Any = jnp.float32
  carry_init: Initializer = nn.initializers.zeros_init()
  kernel_axes: Axes = ("embed", "mlp")
  recurrent_kernel_axes: Axes = (None, "mlp")
  bias_axes: Axes = ("mlp",)
  kernel_stddev_init: Initializer = fan_in_stddev(0.1)
  bias_stddev_init: Initializer = constant_stddev(0.01)
  bayesian_bias: bool = False
  prior: Prior = NormalPrior()
  deterministic: bool | None = None

  estimator: ClassVar[str]

  @nn.compact
  def __call__(self, carry: tuple[Array, Array], inputs: Array,
               deterministic: bool | None = None) -> tuple[tuple[Array, Array], Array]:
    """One time step, as ``nn.LSTMCell``'s.

    Args:
      carry: ``(c, h)``, from ``initialize_carry``.
      inputs: ``(..., input features)`` for this step.
      deterministic: use the posterior mean; overrides the attribute.

    Returns:
      ``((new_c, new_h), new_h)``.
    """
    if self.estimator != "deterministic":
      try:
        use_posterior_mean(self, deterministic)
      except ValueError as e:  # nn.RNN drops rngs its split_rngs does not name
        raise ValueError(f"{e}; inside nn.RNN or nn.scan also pass split_rngs={{'params': "
                         f"False, '{SAMPLE_RNG}': False}}, one weight sample for every step "
                         "(meshbayes.layers.lstm.RNN does)") from None
    c, h = carry
    dense = functools.partial(
        dense_class(self.estimator), features=h.shape[-1], dtype=self.dtype,
        param_dtype=self.param_dtype, kernel_stddev_init=self.kernel_stddev_init,
        bias_stddev_init=self.bias_stddev_init, prior=self.prior,
        deterministic=self.deterministic)
    dense_i = functools.partial(dense, use_bias=False, kernel_init=self.kernel_init,
                                kernel_axes=self.kernel_axes)
    dense_h = functools.partial(dense, use_bias=True, kernel_init=self.recurrent_kernel_init,
                                bias_init=self.bias_init, kernel_axes=self.recurrent_kernel_axes,
                                bias_axes=self.bias_axes, bayesian_bias=self.bayesian_bias)
    gate = lambda name: (dense_i(name=f"i{name}")(inputs, deterministic)
                         + dense_h(name=f"h{name}")(h, deterministic))
    i, f, o = self.gate_fn(gate("i")), self.gate_fn(gate("f")), self.gate_fn(gate("o"))
    g = self.activation_fn(gate("g"))
    new_c = f * c + i * g
    new_h = o * self.activation_fn(new_c)
    return (new_c, new_h), new_h

  @nn.nowrap
  def initialize_carry(self, rng: Array, input_shape: tuple[int, ...]) -> tuple[Array, Array]:
    """The initial ``(c, h)`` for inputs of ``input_shape``, as ``nn.LSTMCell``'s."""
    key_c, key_h = jax.random.split(rng)
    shape = tuple(input_shape[:-1]) + (self.features,)
    return (self.carry_init(key_c, shape, self.param_dtype),
            self.carry_init(key_h, shape, self.param_dtype))

  @property
  def num_feature_axes(self) -> int:
    return 1


class LSTMCell(_LSTMCell):
  """``nn.LSTMCell`` with logical axes: the deterministic twin (same parameters).

  Example::

    >>> import jax, jax.numpy as jnp
    >>> from meshbayes.layers import LSTMCell
    >>> cell = LSTMCell(features=4)
    >>> x = jnp.ones((2, 3))
    >>> carry = cell.initialize_carry(jax.random.key(0), x.shape)
    >>> variables = cell.init(jax.random.key(1), carry, x)
    >>> sorted(variables['params'])
    ['hf', 'hg', 'hi', 'ho', 'if', 'ig', 'ii', 'io']
  """

  estimator = "deterministic"


class LSTMCellReparameterization(_LSTMCell):
  """``nn.LSTMCell`` with normal weight posteriors, one weight sample per call.

  Example::

    >>> import jax, jax.numpy as jnp, flax.linen as nn
    >>> from meshbayes.layers import LSTMCellReparameterization
    >>> rnn = nn.RNN(LSTMCellReparameterization(features=4),
    ...              split_rngs={'params': False, 'sample': False})  # or meshbayes's RNN
    >>> x = jnp.ones((2, 5, 3))  # (batch, time, features)
    >>> variables = rnn.init(jax.random.key(0), x)
    >>> rnn.apply(variables, x, rngs={'sample': jax.random.key(1)}).shape
    (2, 5, 4)
  """

  estimator = "reparameterization"


class LSTMCellFlipout(_LSTMCell):
  """``nn.LSTMCell`` with normal weight posteriors and Flipout: one weight sample per
  example (signs per example, drawn once), the same at every time step when scanned by
  ``RNN``.

  Example::

    >>> import jax, jax.numpy as jnp
    >>> from meshbayes.layers import LSTMCellFlipout, total_kl
    >>> from meshbayes.layers.lstm import RNN
    >>> rnn = RNN(LSTMCellFlipout(features=4))
    >>> x = jnp.ones((2, 5, 3))
    >>> variables = rnn.init(jax.random.key(0), x)
    >>> y, state = rnn.apply(variables, x, rngs={'sample': jax.random.key(1)},
    ...                      mutable=['losses'])
    >>> y.shape, bool(total_kl(state) > 0)
    ((2, 5, 4), True)
  """

  estimator = "flipout"


class RNN(nn.RNN):
  """``nn.RNN`` for Bayesian cells: one weight sample per sequence, the KL recorded.

  Same attributes and call as ``nn.RNN``; ``split_rngs`` defaults to
  ``{'params': False, 'sample': False}``, so every time step sees the same
  noise. ``nn.RNN``'s scan does not lift the KL collection (its value would be
  the same at every step), so, when that collection is mutable, the cell is
  applied once more outside the scan, to the first step, for its KL alone
  (its outputs are unused; under ``jit`` only the KL is computed).

  Example::

    >>> import jax, jax.numpy as jnp
    >>> from meshbayes.layers import LSTMCellReparameterization, total_kl
    >>> from meshbayes.layers.lstm import RNN
    >>> rnn = RNN(LSTMCellReparameterization(features=4), return_carry=True)
    >>> x = jnp.ones((2, 5, 3))  # (batch, time, features)
    >>> variables = rnn.init(jax.random.key(0), x)
    >>> ((c, h), y), state = rnn.apply(variables, x, rngs={'sample': jax.random.key(1)},
    ...                                mutable=['losses'])
    >>> y.shape, bool(total_kl(state) > 0)
    ((2, 5, 4), True)
  """

  split_rngs: Any = FrozenDict({"params": False, SAMPLE_RNG: False})

  def __call__(self, inputs: Array, **kwargs: Any) -> Any:
    """``nn.RNN.__call__`` (same keyword arguments), then the cell's KL if recorded."""
    outputs = super().__call__(inputs, **kwargs)
    if self.is_mutable_collection(KL_COLLECTION) and not self.is_initializing():
      time_major = kwargs.get("time_major")
      time_major = self.time_major if time_major is None else time_major
      time_axis = 0 if time_major else inputs.ndim - self.cell.num_feature_axes - 1
      first = jnp.take(inputs, 0, axis=time_axis)
      self.cell(self.cell.initialize_carry(jax.random.key(0), first.shape), first)
    return outputs


_CLASSES = {"deterministic": LSTMCell, "reparameterization": LSTMCellReparameterization,
            "flipout": LSTMCellFlipout}


def lstm_cell_class(estimator: str) -> type[_LSTMCell]:
  """The LSTM cell class of an estimator name (``deterministic``, ``reparameterization``,
  ``flipout``)."""
  if estimator not in _CLASSES:
    raise ValueError(f"lstm_cell_class: estimator={estimator!r} is not one of "
                     f"{', '.join(LSTM_ESTIMATORS)} (local reparameterization samples "
                     "pre-activations, not weights)")
  return _CLASSES[estimator]
