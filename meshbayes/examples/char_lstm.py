"""A Bayesian LSTM character language model against its deterministic twin (Tatoeba English).

The paper's Figure 1: an embedding, one LSTM layer (``LSTMCellFlipout`` scanned
by ``meshbayes.layers.RNN``: one weight sample per sentence) and a softmax, on
the English sentences ``make data`` prepares, trained on the per-character
negative ELBO; scores validation perplexity and calibration. docs/examples.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import os
import time
from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from meshbayes import predictive
from meshbayes.layers import (KL_COLLECTION, RNN, Dense, Embed, kl_penalty, lstm_cell_class,
                              total_kl)
from meshbayes.metrics import (sum_statistics, token_calibration_metrics,
                               token_calibration_statistics)
from meshbayes.runtime import strict_json

Array = jax.Array

PAD, BOS, EOS, UNK = 0, 1, 2, 3
SPECIALS = ("<pad>", "<s>", "</s>", "<unk>")


@dataclasses.dataclass(frozen=True)
class CharVocabulary:
  """Characters of a training text, after the four specials (pad, BOS, EOS, unknown).

  Attributes:
    chars: the characters of ids ``4, 5, ...``, sorted.

  >>> vocab = CharVocabulary.build(['ab', 'ba!'])
  >>> vocab.size, vocab.chars
  (7, '!ab')
  >>> vocab.encode(['ab?'], max_length=4)  # BOS a b <unk> EOS, padded to 4 + 2
  array([[1, 5, 6, 3, 2, 0]], dtype=int32)
  >>> vocab.decode([1, 5, 6, 3, 2, 0])
  'ab\ufffd'
  """

  chars: str

  @classmethod
  def build(cls, sentences: Sequence[str]) -> CharVocabulary:
    """The vocabulary of every character in ``sentences``."""
    return cls("".join(sorted(set("".join(sentences)))))

  @property
  def size(self) -> int:
    return len(SPECIALS) + len(self.chars)

  def encode(self, sentences: Sequence[str], max_length: int) -> np.ndarray:
    """``(len(sentences), max_length + 2)`` ids ``BOS c_1 ... c_n EOS`` then padding.

    Sentences must have at most ``max_length`` characters; unknown characters
    become ``UNK``.
    """
    index = {c: i + len(SPECIALS) for i, c in enumerate(self.chars)}
    ids = np.full((len(sentences), max_length + 2), PAD, np.int32)
    for row, sentence in enumerate(sentences):
      if len(sentence) > max_length:
        raise ValueError(f"sentence of {len(sentence)} characters > max_length={max_length}")
      ids[row, :len(sentence) + 2] = [BOS, *(index.get(c, UNK) for c in sentence), EOS]
    return ids

  def decode(self, ids: Sequence[int]) -> str:
    """The characters of ``ids`` (specials dropped; unknown as U+FFFD)."""
    return "".join(self.chars[i - len(SPECIALS)] if i >= len(SPECIALS) else "\ufffd"
                   for i in map(int, ids) if i == UNK or i >= len(SPECIALS))


class CharLSTM(nn.Module):
  """Embedding, one LSTM layer (Bayesian or not), softmax layer: next-character logits.

  Attributes:
    vocab_size: number of symbols (specials included).
    embed_dim: width of the character embedding.
    hidden: LSTM width.
    estimator: the cell's estimator, ``deterministic`` (``LSTMCell``),
      ``reparameterization`` or ``flipout``.

  Example::

    >>> import jax, jax.numpy as jnp
    >>> from meshbayes.layers import total_kl
    >>> model = CharLSTM(vocab_size=10, embed_dim=4, hidden=8, estimator='flipout')
    >>> ids = jnp.ones((2, 5), jnp.int32)  # (batch, time)
    >>> variables = model.init(jax.random.key(0), ids)
    >>> logits, state = model.apply(variables, ids, rngs={'sample': jax.random.key(1)},
    ...                             mutable=['losses'])
    >>> logits.shape, bool(total_kl(state) > 0)
    ((2, 5, 10), True)
  """

  vocab_size: int
  embed_dim: int = 32
  hidden: int = 128
  estimator: str = "flipout"

  @nn.compact
  def __call__(self, ids: Array, deterministic: bool | None = None) -> Array:
    """Logits ``(batch, time, vocab_size)`` of the symbol after each of ``ids`` ``(batch, time)``.

    ``deterministic=True`` runs a Bayesian cell at its posterior mean; otherwise
    it needs a ``'sample'`` rng (one weight sample per sequence for Flipout, per
    call for reparameterization).
    """
    x = Embed(num_embeddings=self.vocab_size, features=self.embed_dim,
              embedding_axes=("vocab", "embed"), name="embed")(ids)
    # The cell takes `deterministic` as an attribute: RNN's scan passes it only the carry
    # and the inputs.
    cell = lstm_cell_class(self.estimator)(features=self.hidden, deterministic=deterministic)
    h = RNN(cell, name="lstm")(x)
    return Dense(features=self.vocab_size, kernel_axes=("mlp", "vocab"), bias_axes=("vocab",),
                 name="output")(h)


@dataclasses.dataclass(frozen=True)
class CharLSTMConfig:
  """Settings of a run.

  Attributes:
    steps: Adam steps of each model.
    sentences: distinct English training sentences used.
    val_sentences: distinct English validation sentences scored.
    max_length: longest sentence kept, in characters.
    batch_size: sentences per step.
    embed_dim: character embedding width.
    hidden: LSTM width.
    estimator: the Bayesian cell's, ``flipout`` or ``reparameterization``.
    learning_rate: Adam's step size.
    kl_weight: weight of ``KL / training characters`` in the loss (1: the ELBO).
    num_samples: weight samples of the final model average.
    train_eval_samples: weight samples of the model average during training.
    eval_every: steps between validation evaluations.
    eval_batch_size: validation sentences per forward pass.
    seed: seeds the sentence choice, the batches, the initialization and the samples.
  """

  steps: int = 2000
  sentences: int = 20000
  val_sentences: int = 1000
  max_length: int = 64
  batch_size: int = 64
  embed_dim: int = 32
  hidden: int = 128
  estimator: str = "flipout"
  learning_rate: float = 3e-3
  kl_weight: float = 1.0
  num_samples: int = 16
  train_eval_samples: int = 4
  eval_every: int = 250
  eval_batch_size: int = 500
  seed: int = 0


def english_sentences(path: str | os.PathLike) -> list[str]:
  """The distinct English sentences of a Tatoeba split, in order of first appearance."""
  from meshbayes.data import tatoeba  # pylint: disable=import-outside-toplevel
  return list(dict.fromkeys(pair.english for pair in tatoeba.read_tsv(path).pairs))


def choose(sentences: Sequence[str], count: int, max_length: int, rng: np.random.Generator
           ) -> tuple[list[str], int]:
  """Up to ``count`` of the sentences of at most ``max_length`` characters, in a seeded
  random order; and how many were too long.

  >>> choose(['a', 'bb', 'ccc'], 5, 2, np.random.default_rng(0))[1]
  1
  """
  kept = [s for s in sentences if 0 < len(s) <= max_length]
  order = rng.permutation(len(kept))[:count]
  return [kept[i] for i in order], len(sentences) - len(kept)


def token_nll(logits: Array, targets: Array) -> Array:
  """Per-token ``-log p(target)``, ``(batch, time)``."""
  return -jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], axis=-1)[..., 0]


@functools.partial(jax.jit, static_argnums=(0, 5, 6))
def _batch_statistics(model: CharLSTM, params, inputs: Array, targets: Array, key: Array,
                      num_samples: int, single: bool) -> dict[str, Array]:
  """``token_calibration_statistics`` of one batch: one pass if ``single`` (deterministic
  model or posterior mean), else the model average of ``num_samples`` weight samples."""
  def log_probs_fn(key):
    rngs = None if single else {"sample": key}
    return jax.nn.log_softmax(model.apply({"params": params}, inputs, rngs=rngs,
                                          deterministic=single))

  log_probs = log_probs_fn(key) if single else predictive.model_average(
      predictive.sample_outputs(log_probs_fn, key, num_samples))
  return token_calibration_statistics(log_probs, targets, (targets != PAD).astype(jnp.float32))


def evaluate(model: CharLSTM, params, ids: np.ndarray, key: Array, num_samples: int,
             posterior_mean: bool = False, batch_size: int = 500) -> dict[str, object]:
  """Token metrics (``token_calibration_metrics`` plus ``perplexity``) of encoded sentences.

  The deterministic model, or ``posterior_mean``, scores one pass; otherwise the
  model average of ``num_samples`` weight samples.
  """
  single = model.estimator == "deterministic" or posterior_mean
  statistics = []
  for start in range(0, len(ids), batch_size):
    chunk = jnp.asarray(ids[start:start + batch_size])
    statistics.append(_batch_statistics(model, params, chunk[:, :-1], chunk[:, 1:],
                                        jax.random.fold_in(key, start), num_samples, single))
  metrics = token_calibration_metrics(sum_statistics(statistics))
  metrics["perplexity"] = math.exp(metrics["nll"])
  return metrics


def train(model: CharLSTM, train_ids: np.ndarray, val_ids: np.ndarray, config: CharLSTMConfig
          ) -> tuple[dict, list[dict[str, float]], float]:
  """Trains ``model`` on ``train_ids``; returns its parameters, the validation curve and the
  training seconds (evaluations excluded)."""
  key_init, key_train, key_eval = jax.random.split(jax.random.key(config.seed), 3)
  params = model.init(key_init, jnp.asarray(train_ids[:1, :-1]))["params"]
  optimizer = optax.adam(config.learning_rate)
  opt_state = optimizer.init(params)
  bayesian = model.estimator != "deterministic"
  num_train_chars = int(np.sum(train_ids[:, 1:] != PAD))

  def loss_fn(params, ids, key):
    inputs, targets = ids[:, :-1], ids[:, 1:]
    logits, state = model.apply({"params": params}, inputs, rngs={"sample": key},
                                mutable=[KL_COLLECTION])
    weights = (targets != PAD).astype(jnp.float32)
    nll = jnp.sum(token_nll(logits, targets) * weights) / jnp.sum(weights)
    kl = total_kl(state)
    return nll + kl_penalty(kl, num_train_chars, config.kl_weight), (nll, kl)

  @jax.jit
  def train_step(params, opt_state, ids, step):
    grads, aux = jax.grad(loss_fn, has_aux=True)(params, ids, jax.random.fold_in(key_train, step))
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, aux

  def record(step, nll, kl):
    # The last step's batch NLL and KL (None before training: JSON has no NaN).
    point = {"step": step, "train_nll": None if nll is None else float(nll),
             "kl": None if kl is None else float(kl)}
    if bayesian:
      point["perplexity"] = evaluate(model, params, val_ids, key_eval, config.train_eval_samples,
                                     batch_size=config.eval_batch_size)["perplexity"]
      point["perplexity_posterior_mean"] = evaluate(
          model, params, val_ids, key_eval, 1, posterior_mean=True,
          batch_size=config.eval_batch_size)["perplexity"]
    else:
      point["perplexity"] = evaluate(model, params, val_ids, key_eval, 1,
                                     batch_size=config.eval_batch_size)["perplexity"]
    print(f"{model.estimator} step {step}: "
          + ", ".join(f"{k} {v:.4g}" for k, v in point.items() if v is not None and k != "step"),
          flush=True)
    return point

  batches = np.random.default_rng(config.seed)
  curve, seconds = [record(0, None, None)], 0.0
  for step in range(1, config.steps + 1):
    start = time.perf_counter()
    batch = jnp.asarray(train_ids[batches.integers(0, len(train_ids), config.batch_size)])
    params, opt_state, (nll, kl) = train_step(params, opt_state, batch, step)
    if step % config.eval_every == 0 or step == config.steps:
      nll, kl = float(nll), float(kl)  # waits for the step, inside the timing
    seconds += time.perf_counter() - start
    if step % config.eval_every == 0 or step == config.steps:
      curve.append(record(step, nll, kl))
  return params, curve, seconds


def run(config: CharLSTMConfig, output_dir: str, train_text: Sequence[str] | None = None,
        val_text: Sequence[str] | None = None) -> dict[str, object]:
  """Trains both models, evaluates them, writes the figure and the JSON; returns its numbers.

  ``train_text`` and ``val_text`` (sentences) replace the Tatoeba splits when given.
  """
  if train_text is None or val_text is None:
    from meshbayes.data import paths, tatoeba  # pylint: disable=import-outside-toplevel
    root = paths.data_dir()
    train_text = english_sentences(tatoeba.split_path(root, "train")) if train_text is None \
        else train_text
    val_text = english_sentences(tatoeba.split_path(root, "validation")) if val_text is None \
        else val_text
  rng = np.random.default_rng(config.seed)
  train_sentences, train_too_long = choose(train_text, config.sentences, config.max_length, rng)
  val_sentences, val_too_long = choose(val_text, config.val_sentences, config.max_length, rng)
  vocab = CharVocabulary.build(train_sentences)
  train_ids = vocab.encode(train_sentences, config.max_length)
  val_ids = vocab.encode(val_sentences, config.max_length)
  results: dict[str, object] = {
      "config": dataclasses.asdict(config),
      "vocabulary": {"unit": "unicode character", "size": vocab.size,
                     "specials": list(SPECIALS), "chars": vocab.chars},
      "train_sentences": len(train_sentences),
      "train_characters": int(np.sum(train_ids[:, 1:] != PAD)),  # targets, EOS included
      "val_sentences": len(val_sentences),
      "val_characters": int(np.sum(val_ids[:, 1:] != PAD)),
      "val_unknown_characters": int(np.sum(val_ids == UNK)),
      "too_long_dropped": {"train": train_too_long, "validation": val_too_long},
      "uniform_perplexity": vocab.size,
  }

  curves = {}
  for name, estimator in (("bayesian", config.estimator), ("deterministic", "deterministic")):
    model = CharLSTM(vocab_size=vocab.size, embed_dim=config.embed_dim, hidden=config.hidden,
                     estimator=estimator)
    params, curves[name], seconds = train(model, train_ids, val_ids, config)
    key = jax.random.key(config.seed + 1)
    final = evaluate(model, params, val_ids, key, config.num_samples,
                     batch_size=config.eval_batch_size)
    metrics = {"estimator": estimator, "train_seconds": seconds,
               "final_train_nll": curves[name][-1]["train_nll"], **_scalars(final),
               "reliability": _bins(final)}
    if estimator != "deterministic":
      metrics["num_samples"] = config.num_samples
      metrics["final_kl"] = curves[name][-1]["kl"]
      metrics["posterior_mean"] = _scalars(evaluate(model, params, val_ids, key, 1,
                                                    posterior_mean=True,
                                                    batch_size=config.eval_batch_size))
    results[name] = metrics
  results["curves"] = curves

  os.makedirs(output_dir, exist_ok=True)
  _plot(os.path.join(output_dir, "char_lstm.png"), curves, config, vocab.size)
  with open(os.path.join(output_dir, "char_lstm.json"), "w") as f:
    f.write(strict_json.dumps(results, null_reasons=strict_json.NULL_REASONS, indent=2))
  return results


def _scalars(metrics: dict[str, object]) -> dict[str, float]:
  return {k: float(metrics[k]) for k in
          ("perplexity", "nll", "accuracy", "ece", "weighted_ece", "brier", "tokens")}


def _bins(metrics: dict[str, object]) -> dict[str, list[float | None]]:
  return {k: [None if np.isnan(v) else float(v) for v in np.asarray(metrics[k])]
          for k in ("bin_confidence", "bin_accuracy", "bin_count")}


def _plot(path: str, curves: dict[str, list[dict[str, float]]], config: CharLSTMConfig,
          vocab_size: int) -> None:
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  import matplotlib.ticker  # pylint: disable=import-outside-toplevel
  fig, ax = plt.subplots(figsize=(7, 4.5))
  steps = lambda name: [p["step"] for p in curves[name]]
  ax.plot(steps("bayesian"), [p["perplexity"] for p in curves["bayesian"]], marker="o",
          color="tab:blue",
          label=f"Bayesian LSTM ({config.estimator}), "
          f"average of {config.train_eval_samples} samples")
  ax.plot(steps("bayesian"), [p["perplexity_posterior_mean"] for p in curves["bayesian"]],
          marker="o", color="tab:blue", linestyle="--", label="Bayesian LSTM, posterior mean")
  ax.plot(steps("deterministic"), [p["perplexity"] for p in curves["deterministic"]], marker="s",
          color="tab:orange", label="deterministic LSTM")
  ax.axhline(vocab_size, color="gray", linestyle=":", label=f"uniform ({vocab_size} symbols)")
  ax.set(yscale="log", xlabel="training step", ylabel="validation perplexity per character",
         title=f"Character LSTM ({config.hidden} units): validation perplexity")
  ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
  ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
  ax.set_yticks([2, 3, 4, 5, 6, 8, 10, 20, 40, 80])
  ax.legend(fontsize="small")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def main(argv: Sequence[str] | None = None, train_text: Sequence[str] | None = None,
         val_text: Sequence[str] | None = None) -> dict[str, object]:
  defaults = CharLSTMConfig()
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--output_dir", default="runs/examples/char_lstm")
  for field in dataclasses.fields(CharLSTMConfig):
    if field.name == "estimator":
      parser.add_argument("--estimator", default=defaults.estimator,
                          choices=("flipout", "reparameterization"))
    else:
      parser.add_argument(f"--{field.name}", type=type(getattr(defaults, field.name)),
                          default=getattr(defaults, field.name))
  args = vars(parser.parse_args(argv))
  output_dir = args.pop("output_dir")
  results = run(CharLSTMConfig(**args), output_dir, train_text, val_text)
  print(strict_json.dumps({k: ({m: v for m, v in results[k].items() if m != "reliability"}
                               if isinstance(results[k], dict) else results[k])
                           for k in ("bayesian", "deterministic", "uniform_perplexity")},
                          null_reasons=strict_json.NULL_REASONS, indent=2))
  return results


if __name__ == "__main__":
  main()
