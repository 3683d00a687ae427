"""Configuration of the Bayesian Transformer: its sizes and each component's estimator."""

from __future__ import annotations

import dataclasses

from meshbayes.field_checks import positive_int
from meshbayes.layers import DENSE_ESTIMATORS, ESTIMATORS
from meshbayes.layers.dense import GROUPED

ACTIVATIONS = ("relu", "gelu", "silu", "linear")
REMAT_POLICIES = ("none", "full", "minimal")
DTYPES = ("float32", "bfloat16")
ATTENTION_KERNELS = ("xla", "cudnn")
SEQUENCE_SAMPLED = ("attention", "cross_attention", "mlp")
PRIORS = ("normal", "fan_in", "empirical_bayes")
# The components built of Dense layers that take the number of weight groups from the
# config (blocks.py); the embedding and the logits offer the estimators every family has.
GROUPED_COMPONENTS = ("attention", "cross_attention", "mlp")


@dataclasses.dataclass(frozen=True)
class Estimators:
  """The estimator of each component: ``deterministic``, ``reparameterization``,
  ``flipout`` or ``local_reparameterization``.

  The attention and feed-forward components also take ``grouped_reparameterization``
  (one weight sample per group of the batch: ``TransformerConfig.num_weight_groups``).

  The defaults are the paper's Bayesian Transformer: Flipout attention,
  local-reparameterization feed-forward layers, deterministic embeddings and
  logits. ``Estimators.deterministic()`` is the plain Transformer baseline.

  Attributes:
    attention: self-attention projections (query, key, value, out) of the
      encoder and decoder.
    cross_attention: the decoder's encoder-decoder attention projections.
    mlp: feed-forward layers (``wi``, ``wo``).
    embedding: the shared token embedding.
    logits: the output projection (or, with tied logits, nothing more: the
      embedding's estimator applies).
  """

  attention: str = "flipout"
  cross_attention: str = "flipout"
  mlp: str = "local_reparameterization"
  embedding: str = "deterministic"
  logits: str = "deterministic"

  def __post_init__(self):
    for field in dataclasses.fields(self):
      value = getattr(self, field.name)
      allowed = DENSE_ESTIMATORS if field.name in GROUPED_COMPONENTS else ESTIMATORS
      if value not in allowed:
        only = (f" ({GROUPED} is for {', '.join(GROUPED_COMPONENTS)} only)"
                if value == GROUPED else "")
        raise ValueError(f"Estimators: {field.name}={value!r} is not one of "
                         f"{', '.join(allowed)}{only}")

  @classmethod
  def deterministic(cls) -> Estimators:
    """Every component deterministic: the baseline Transformer."""
    return cls(**{f.name: "deterministic" for f in dataclasses.fields(cls)})

  @property
  def is_bayesian(self) -> bool:
    return any(getattr(self, f.name) != "deterministic" for f in dataclasses.fields(self))

  @property
  def grouped(self) -> tuple[str, ...]:
    """The components whose estimator is the grouped reparameterization."""
    return tuple(c for c in GROUPED_COMPONENTS if getattr(self, c) == GROUPED)


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
  """An encoder-decoder Transformer in the T5 v1.1 style.

  Attributes:
    vocab_size: vocabulary size (shared by inputs and targets).
    emb_dim: model width (``d_model``).
    num_heads: attention heads.
    head_dim: width of each head (``d_kv``).
    num_encoder_layers: encoder blocks.
    num_decoder_layers: decoder blocks.
    mlp_dim: feed-forward width (``d_ff``).
    mlp_activations: one activation per input matrix: ``('gelu', 'linear')`` is
      T5 v1.1's gated GELU (three matrices), ``('relu',)`` the Mesh TensorFlow
      Transformer's (two matrices).
    dropout_rate: dropout after embeddings and sublayers (masks shared over a
      sentence's positions), on the feed-forward hidden units, and on attention
      weights.
    attention_dropout_rate: dropout on attention weights (None: ``dropout_rate``).
    attention_kernel: how the attention weights are computed: ``xla`` (the scores
      written out, logits and softmax in float32; every platform) or ``cudnn``
      (cuDNN's fused attention, the scores kept on chip: NVIDIA GPUs or a GPU
      target only, and no attention dropout, since JAX's cuDNN path fixes the
      dropout seed when the step is compiled). Parameters are the same for both.
    logits_via_embedding: tie the output projection to the token embedding.
    relpos_num_buckets: relative position buckets.
    relpos_max_distance: distance beyond which positions share a bucket.
    dtype: compute dtype (``float32`` or ``bfloat16``); parameters stay float32.
    scan_layers: stack each side's layers with ``nn.scan`` (a ``layers`` axis),
      which compiles in time independent of depth.
    remat_policy: rematerialize layers in the backward pass: ``none``, ``full``
      or ``minimal`` (save matmul outputs).
    estimators: each component's estimator.
    prior: the prior of every Bayesian weight tensor: ``normal``,
      ``N(0, prior_stddev^2)``; ``fan_in``, ``N(0, prior_stddev^2 / fan_in)``
      (``prior_stddev=1`` is the weights' own scale at initialization);
      ``empirical_bayes``, ``N(m, s^2)`` with ``m`` and ``s`` per tensor fitted by
      the ELBO, from ``N(0, prior_stddev^2 / fan_in)``.
    prior_stddev: the prior's standard deviation (its scale, for ``fan_in``
      and ``empirical_bayes``).
    posterior_stddev_ratio: initial posterior stddev as a fraction of
      ``1 / sqrt(fan_in)`` (see ``meshbayes.layers.initializers``).
    one_sample_per_sequence: components (``attention``, ``cross_attention``,
      ``mlp``) whose Flipout draws one weight sample per sequence (signs per
      example, shared over its positions: the objective prediction uses) rather
      than one per position; reparameterization always does, and local
      reparameterization cannot.
    noise_dtype: dtype of the Bayesian attention and feed-forward layers'
      activation-sized noise work (local reparameterization's variance, its square
      root and noise; Flipout's weight perturbation): None, float32 as written;
      ``bfloat16`` halves its bytes, a change of the numbers by rounding
      (``meshbayes.layers.Dense``'s ``noise_dtype``). Reparameterization and
      deterministic layers have none.
    num_weight_groups: the grouped reparameterization's weight samples per call:
      the batch the model is called with is cut into this many equal consecutive
      groups, each seeing its own sample (1: one sample per call, reparameterization
      bit for bit; the batch size: one per example; the data shards: one per shard,
      drawn where its data is). It must divide that batch; a value other than 1
      needs a component whose estimator is ``grouped_reparameterization``. The
      posterior mean has no groups (any batch).
  """

  vocab_size: int = 32128
  emb_dim: int = 512
  num_heads: int = 8
  head_dim: int = 64
  num_encoder_layers: int = 6
  num_decoder_layers: int = 6
  mlp_dim: int = 2048
  mlp_activations: tuple[str, ...] = ("gelu", "linear")
  dropout_rate: float = 0.1
  attention_dropout_rate: float | None = None
  attention_kernel: str = "xla"
  logits_via_embedding: bool = False
  relpos_num_buckets: int = 32
  relpos_max_distance: int = 128
  dtype: str = "float32"
  scan_layers: bool = True
  remat_policy: str = "none"
  estimators: Estimators = Estimators()
  prior: str = "normal"
  prior_stddev: float = 1.0
  posterior_stddev_ratio: float = 0.1
  one_sample_per_sequence: tuple[str, ...] = ()
  noise_dtype: str | None = None
  num_weight_groups: int = 1

  def __post_init__(self):
    object.__setattr__(self, "mlp_activations", tuple(self.mlp_activations))
    object.__setattr__(self, "one_sample_per_sequence", tuple(self.one_sample_per_sequence))
    for component in self.one_sample_per_sequence:
      if component not in SEQUENCE_SAMPLED:
        raise ValueError(f"TransformerConfig: one_sample_per_sequence names {component!r}; "
                         f"components: {', '.join(SEQUENCE_SAMPLED)}")
      if getattr(self.estimators, component) == "local_reparameterization":
        raise ValueError(f"TransformerConfig: one_sample_per_sequence names {component!r}, "
                         "whose estimator local_reparameterization samples each position; "
                         "use flipout or reparameterization there")
    for name in ("vocab_size", "emb_dim", "num_heads", "head_dim", "num_encoder_layers",
                 "num_decoder_layers", "mlp_dim", "relpos_num_buckets", "relpos_max_distance"):
      if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
        raise ValueError(f"TransformerConfig: {name}={getattr(self, name)!r} must be a "
                         "positive int")
    for name in ("dropout_rate", "attention_dropout_rate"):
      value = getattr(self, name)
      if value is not None and not 0.0 <= value < 1.0:
        raise ValueError(f"TransformerConfig: {name}={value!r} must be in [0, 1)")
    if self.attention_kernel not in ATTENTION_KERNELS:
      raise ValueError(f"TransformerConfig: attention_kernel={self.attention_kernel!r} must be "
                       f"one of {ATTENTION_KERNELS}")
    if self.attention_kernel == "cudnn" and self.attention_weight_dropout > 0:
      raise ValueError(f"TransformerConfig: attention_kernel='cudnn' takes no attention dropout "
                       f"(attention_dropout_rate={self.attention_weight_dropout}): JAX's cuDNN "
                       "attention fixes its dropout seed at compile time, so every step would "
                       "drop the same weights; set attention_dropout_rate=0.0 (a change to what "
                       "is trained) or attention_kernel='xla'")
    if not self.mlp_activations or any(a not in ACTIVATIONS for a in self.mlp_activations):
      raise ValueError(f"TransformerConfig: mlp_activations={self.mlp_activations!r} must be a "
                       f"non-empty tuple of {', '.join(ACTIVATIONS)}")
    if self.dtype not in DTYPES:
      raise ValueError(f"TransformerConfig: dtype={self.dtype!r} must be one of {DTYPES}")
    if self.noise_dtype is not None and self.noise_dtype not in DTYPES:
      raise ValueError(f"TransformerConfig: noise_dtype={self.noise_dtype!r} must be None "
                       f"(float32) or one of {DTYPES}")
    if self.remat_policy not in REMAT_POLICIES:
      raise ValueError(f"TransformerConfig: remat_policy={self.remat_policy!r} must be one of "
                       f"{REMAT_POLICIES}")
    if self.prior not in PRIORS:
      raise ValueError(f"TransformerConfig: prior={self.prior!r} must be one of {PRIORS}")
    for name in ("prior_stddev", "posterior_stddev_ratio"):
      if not getattr(self, name) > 0:
        raise ValueError(f"TransformerConfig: {name}={getattr(self, name)!r} must be positive")
    if not isinstance(self.estimators, Estimators):
      raise ValueError(f"TransformerConfig: estimators={self.estimators!r} must be an Estimators")
    positive_int("TransformerConfig", "num_weight_groups", self.num_weight_groups)
    if self.num_weight_groups != 1 and not self.estimators.grouped:
      raise ValueError(f"TransformerConfig: num_weight_groups={self.num_weight_groups} needs "
                       f"a component ({', '.join(GROUPED_COMPONENTS)}) whose estimator is "
                       f"{GROUPED}; with none it must be 1")

  @property
  def attention_weight_dropout(self) -> float:
    """The dropout rate of the attention weights."""
    return self.dropout_rate if self.attention_dropout_rate is None else \
        self.attention_dropout_rate

  def replace(self, **changes) -> TransformerConfig:
    return dataclasses.replace(self, **changes)
