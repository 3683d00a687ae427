"""The encoder-decoder Transformer (T5 v1.1 style) built from Bayesian layers.

Pre-norm residual blocks with RMSNorm, relative position biases shared within a stack,
gated-GELU (or ReLU) feed-forward, no biases, dropout. With ``config.scan_layers`` each
stack is one ``nn.scan``-ned layer whose parameters have a leading ``layers`` axis.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from meshbayes.layers import KL_COLLECTION, embed_class
from meshbayes.models.transformer.blocks import (
  BATCH_LENGTH_EMBED,
  MlpBlock,
  MultiHeadAttention,
  RelativePositionBias,
  RMSNorm,
  compute_dtype,
  dense_general,
)
from meshbayes.models.transformer.config import TransformerConfig

Array = jax.Array

_REMAT = {"full": None, "minimal": jax.checkpoint_policies.dots_with_no_batch_dims_saveable}


def attention_mask(query_valid: Array, key_valid: Array, causal: bool = False) -> Array:
  """``(batch, 1, queries, keys)`` booleans: both valid, and key <= query if causal."""
  mask = query_valid[:, None, :, None] & key_valid[:, None, None, :]
  if causal:
    q, k = query_valid.shape[-1], key_valid.shape[-1]
    mask = mask & (jnp.arange(k)[None, :] <= jnp.arange(q)[:, None])[None, None]
  return mask


class EncoderLayer(nn.Module):
  """Self-attention then feed-forward, each pre-normed and residual."""

  config: TransformerConfig
  enable_dropout: bool = False
  deterministic: bool = False

  @nn.compact
  def __call__(self, x: Array, mask: Array, bias: Array) -> tuple[Array, None]:
    cfg, dropout = self.config, nn.Dropout(self.config.dropout_rate, broadcast_dims=(-2,))
    flags = dict(enable_dropout=self.enable_dropout, deterministic=self.deterministic)
    h = RMSNorm(compute_dtype(cfg), name="pre_attention_norm")(x)
    h = MultiHeadAttention(cfg, "attention", name="attention", **flags)(
        h, h, mask, bias)
    x = x + dropout(h, deterministic=not self.enable_dropout)
    h = RMSNorm(compute_dtype(cfg), name="pre_mlp_norm")(x)
    h = MlpBlock(cfg, name="mlp", **flags)(h)
    x = x + dropout(h, deterministic=not self.enable_dropout)
    return nn.with_logical_constraint(x, BATCH_LENGTH_EMBED), None


class DecoderLayer(nn.Module):
  """Causal self-attention, encoder-decoder attention, feed-forward."""

  config: TransformerConfig
  enable_dropout: bool = False
  deterministic: bool = False
  decode: bool = False

  @nn.compact
  def __call__(self, x: Array, encoded: Array, self_mask: Array | None, cross_mask: Array,
               bias: Array) -> tuple[Array, None]:
    cfg, dropout = self.config, nn.Dropout(self.config.dropout_rate, broadcast_dims=(-2,))
    flags = dict(enable_dropout=self.enable_dropout, deterministic=self.deterministic)
    h = RMSNorm(compute_dtype(cfg), name="pre_self_attention_norm")(x)
    h = MultiHeadAttention(cfg, "attention", decode=self.decode,
                           name="self_attention", **flags)(h, h, self_mask, bias)
    x = x + dropout(h, deterministic=not self.enable_dropout)
    h = RMSNorm(compute_dtype(cfg), name="pre_cross_attention_norm")(x)
    h = MultiHeadAttention(cfg, "cross_attention",
                           name="encoder_decoder_attention", **flags)(h, encoded, cross_mask, None)
    x = x + dropout(h, deterministic=not self.enable_dropout)
    h = RMSNorm(compute_dtype(cfg), name="pre_mlp_norm")(x)
    h = MlpBlock(cfg, name="mlp", **flags)(h)
    x = x + dropout(h, deterministic=not self.enable_dropout)
    return nn.with_logical_constraint(x, BATCH_LENGTH_EMBED), None


def run_layers(layer_cls: type[nn.Module], config: TransformerConfig, num_layers: int,
               x: Array, *args: Array, **attributes) -> Array:
  """Applies ``num_layers`` layers, scanned (a ``layers`` parameter axis) or unrolled.

  Must be called from inside a compact method of the stack module.
  """
  if config.remat_policy != "none":
    layer_cls = nn.remat(layer_cls, policy=_REMAT[config.remat_policy],
                         prevent_cse=not config.scan_layers)
  if config.scan_layers:
    stack = nn.scan(layer_cls, variable_axes={"params": 0, "cache": 0, KL_COLLECTION: 0},
                    split_rngs={"params": True, "dropout": True, "sample": True},
                    in_axes=(nn.broadcast,) * len(args), length=num_layers,
                    metadata_params={nn.PARTITION_NAME: "layers"})
    x, _ = stack(config, name="layers", **attributes)(x, *args)
    return x
  for i in range(num_layers):
    x, _ = layer_cls(config, name=f"layers_{i}", **attributes)(x, *args)
  return x


class Encoder(nn.Module):
  """Token embedding, encoder layers, final norm."""

  config: TransformerConfig
  embedder: nn.Module

  @nn.compact
  def __call__(self, tokens: Array, enable_dropout: bool = False,
               deterministic: bool = False) -> Array:
    cfg = self.config
    x = self.embedder(tokens, deterministic).astype(compute_dtype(cfg))
    x = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))(x, deterministic=not enable_dropout)
    x = nn.with_logical_constraint(x, BATCH_LENGTH_EMBED)
    positions = jnp.arange(tokens.shape[-1])
    bias = RelativePositionBias(cfg.num_heads, cfg.relpos_num_buckets, cfg.relpos_max_distance,
                                bidirectional=True, name="relpos_bias")(positions, positions)
    valid = tokens > 0
    x = run_layers(EncoderLayer, cfg, cfg.num_encoder_layers, x, attention_mask(valid, valid),
                   bias, enable_dropout=enable_dropout, deterministic=deterministic)
    x = RMSNorm(compute_dtype(cfg), name="encoder_norm")(x)
    x = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))(x, deterministic=not enable_dropout)
    return nn.with_logical_constraint(x, BATCH_LENGTH_EMBED)


class Decoder(nn.Module):
  """Token embedding, decoder layers, final norm, output logits."""

  config: TransformerConfig
  embedder: nn.Module

  @nn.compact
  def __call__(self, encoded: Array, encoder_tokens: Array, decoder_input_tokens: Array,
               decoder_target_tokens: Array | None = None, enable_dropout: bool = False,
               deterministic: bool = False, decode: bool = False,
               max_decode_length: int | None = None) -> Array:
    cfg = self.config
    x = self.embedder(decoder_input_tokens, deterministic).astype(compute_dtype(cfg))
    x = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))(x, deterministic=not enable_dropout)
    x = nn.with_logical_constraint(x, BATCH_LENGTH_EMBED)
    relpos = RelativePositionBias(cfg.num_heads, cfg.relpos_num_buckets, cfg.relpos_max_distance,
                                  bidirectional=False, name="relpos_bias")
    encoder_valid = encoder_tokens > 0
    if decode:
      # One position per call; the position itself lives in the cache.
      initialized = self.has_variable("cache", "position")
      position = self.variable("cache", "position", lambda: jnp.zeros((), jnp.int32))
      length = max_decode_length or decoder_input_tokens.shape[-1]
      bias = relpos(position.value[None], jnp.arange(length))
      if initialized:
        position.value = position.value + 1
      self_mask = None
      query_valid = jnp.ones(decoder_input_tokens.shape, bool)
    else:
      positions = jnp.arange(decoder_input_tokens.shape[-1])
      bias = relpos(positions, positions)
      query_valid = (decoder_input_tokens if decoder_target_tokens is None
                     else decoder_target_tokens) > 0
      self_mask = attention_mask(query_valid, query_valid, causal=True)
    x = run_layers(DecoderLayer, cfg, cfg.num_decoder_layers, x, encoded, self_mask,
                   attention_mask(query_valid, encoder_valid), bias,
                   enable_dropout=enable_dropout, deterministic=deterministic, decode=decode)
    x = RMSNorm(compute_dtype(cfg), name="decoder_norm")(x)
    x = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))(x, deterministic=not enable_dropout)
    if cfg.logits_via_embedding:
      logits = self.embedder.attend(x, deterministic) / math.sqrt(cfg.emb_dim)
    else:
      logits = dense_general(
          cfg, cfg.estimators.logits, features=cfg.vocab_size,
          kernel_init=nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal"),
          kernel_axes=("embed", "vocab"), name="logits_dense")(x, deterministic)
    return nn.with_logical_constraint(logits.astype(jnp.float32), ("batch", "length", "vocab"))


class Transformer(nn.Module):
  """The encoder-decoder Transformer.

  Example::

    >>> import jax, jax.numpy as jnp
    >>> from meshbayes.models.transformer import Transformer, TransformerConfig
    >>> config = TransformerConfig(vocab_size=16, emb_dim=8, num_heads=2, head_dim=4,
    ...                            num_encoder_layers=1, num_decoder_layers=1, mlp_dim=16)
    >>> model = Transformer(config)
    >>> tokens = jnp.ones((2, 5), jnp.int32)
    >>> variables = jax.jit(model.init)(jax.random.key(0), tokens, tokens)
    >>> logits = jax.jit(model.apply)(variables, tokens, tokens, rngs={'sample': jax.random.key(1)})
    >>> logits.shape
    (2, 5, 16)

  Attributes:
    config: sizes and estimators.
  """

  config: TransformerConfig

  def setup(self):
    cfg = self.config
    self.token_embedder = embed_class(cfg.estimators.embedding)(
        num_embeddings=cfg.vocab_size, features=cfg.emb_dim, dtype=compute_dtype(cfg),
        embedding_init=nn.initializers.normal(stddev=1.0), embedding_axes=("vocab", "embed"),
        name="token_embedder")
    self.encoder = Encoder(cfg, self.token_embedder, name="encoder")
    self.decoder = Decoder(cfg, self.token_embedder, name="decoder")

  def encode(self, encoder_input_tokens: Array, enable_dropout: bool = False,
             deterministic: bool = False) -> Array:
    """Encoder outputs ``(batch, input length, emb_dim)``."""
    return self.encoder(encoder_input_tokens, enable_dropout, deterministic)

  def decode(self, encoded: Array, encoder_input_tokens: Array, decoder_input_tokens: Array,
             decoder_target_tokens: Array | None = None, enable_dropout: bool = False,
             deterministic: bool = False, decode: bool = False,
             max_decode_length: int | None = None) -> Array:
    """Output logits ``(batch, target length, vocab)`` (float32)."""
    return self.decoder(encoded, encoder_input_tokens, decoder_input_tokens,
                        decoder_target_tokens, enable_dropout, deterministic, decode,
                        max_decode_length)

  def __call__(self, encoder_input_tokens: Array, decoder_input_tokens: Array,
               decoder_target_tokens: Array | None = None, enable_dropout: bool = False,
               deterministic: bool = False) -> Array:
    """Teacher-forced logits.

    Args:
      encoder_input_tokens: ``(batch, input length)`` ids, 0 is padding.
      decoder_input_tokens: ``(batch, target length)`` targets shifted right.
      decoder_target_tokens: ``(batch, target length)`` targets (for masks).
      enable_dropout: apply dropout (training).
      deterministic: Bayesian layers use their posterior mean instead of
        sampling from the ``'sample'`` rng.
    """
    encoded = self.encode(encoder_input_tokens, enable_dropout, deterministic)
    return self.decode(encoded, encoder_input_tokens, decoder_input_tokens,
                       decoder_target_tokens, enable_dropout, deterministic)
