"""The Bayesian Layers paper's Bayesian ResNet-50 counted from shapes; a small one on digits.

``ResNet`` is the paper's appendix ResNet-50 (``ConvFlipout`` convolutions, a
final ``DenseVariationalDropout``); ``estimator='deterministic'`` is the standard
ResNet-50, whose count must equal torchvision's 25,557,032. docs/examples.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from meshbayes.examples.lenet_digits import (
  LeNetDigitsConfig,
  evaluate,
  load_digits_split,
  sample_log_probs,
  train,
)
from meshbayes.layers import DenseVariationalDropout, conv_class, count_parameters, dense_class
from meshbayes.runtime import strict_json

Array = jax.Array

RESNET50_STAGES = (3, 4, 6, 3)
TORCHVISION_RESNET50_PARAMETERS = 25_557_032
_CONV_AXES = (None, None, "embed", "mlp")


def _batch_norm(name: str) -> nn.BatchNorm:
  """Batch norm as torchvision's (momentum 0.9 in flax's terms, epsilon 1e-5), scale and bias
  on the ``mlp`` axis; Keras' slower momentum 0.99 leaves the running statistics unusable
  after a short training."""
  return nn.BatchNorm(momentum=0.9, epsilon=1e-5, name=name,
                      scale_init=nn.with_logical_partitioning(nn.initializers.ones, ("mlp",)),
                      bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("mlp",)))


class BottleneckBlock(nn.Module):
  """A bottleneck block: 1x1, kxk and 1x1 convolutions, each followed by batch norm.

  Attributes:
    filters: the three convolutions' widths (the last is the block's output).
    strides: stride of the first 1x1 convolution and of the shortcut.
    projection: a 1x1 convolution (and batch norm) on the shortcut: the
      paper's ``conv_block``; without it the ``identity_block``.
    kernel_size: the middle convolution's kernel size.
    estimator: the convolutions' estimator name (``conv_class``).
  """

  filters: tuple[int, int, int]
  strides: int = 1
  projection: bool = False
  kernel_size: int = 3
  estimator: str = "flipout"

  @nn.compact
  def __call__(self, x: Array, deterministic: bool | None = None,
               use_running_average: bool = True) -> Array:
    """The block's output ``(batch, height / strides, width / strides, filters[-1])``."""
    conv = lambda features, size, strides, name: conv_class(self.estimator)(
        features, (size, size), strides=strides, padding="SAME", use_bias=False,
        kernel_axes=_CONV_AXES, name=name)
    norm = lambda y, name: _batch_norm(name)(y, use_running_average=use_running_average)
    f1, f2, f3 = self.filters
    y = nn.relu(norm(conv(f1, 1, self.strides, "conv_0")(x, deterministic), "norm_0"))
    y = nn.relu(norm(conv(f2, self.kernel_size, 1, "conv_1")(y, deterministic), "norm_1"))
    y = norm(conv(f3, 1, 1, "conv_2")(y, deterministic), "norm_2")
    if self.projection:
      x = norm(conv(f3, 1, self.strides, "shortcut")(x, deterministic), "norm_shortcut")
    return nn.relu(x + y)


class ResNet(nn.Module):
  """The paper's Bayesian ResNet (ResNet-50 by default), one estimator switch.

  Example (a tiny one, counted from shapes)::

    >>> import jax, jax.numpy as jnp
    >>> from meshbayes.layers import count_parameters
    >>> model = ResNet(stage_sizes=(1,), width=4, num_classes=3, small_inputs=True)
    >>> shapes = jax.eval_shape(model.init, jax.random.key(0), jnp.ones((1, 8, 8, 1)))
    >>> count_parameters(shapes['params'])
    ParameterCounts(total=835, bayesian_weights=372, point_weights=91)

  Attributes:
    stage_sizes: bottleneck blocks per stage (ResNet-50: 3, 4, 6, 3).
    width: the first stage's bottleneck width, doubled each stage.
    num_classes: outputs of the final layer.
    estimator: the convolutions' estimator (``'flipout'``: the paper's;
      ``'deterministic'``: the standard ResNet, with a ``Dense`` final layer).
    small_inputs: a 3x3 stride-1 stem without max pool (for 8x8 images), in
      place of the 7x7 stride-2 stem and 3x3 stride-2 max pool.
  """

  stage_sizes: Sequence[int] = RESNET50_STAGES
  width: int = 64
  num_classes: int = 1000
  estimator: str = "flipout"
  small_inputs: bool = False

  @nn.compact
  def __call__(self, x: Array, deterministic: bool | None = None,
               use_running_average: bool = True) -> Array:
    """Logits ``(batch, num_classes)`` of images ``(batch, height, width, channels)``.

    Args:
      x: the images, channels last.
      deterministic: posterior means (the pruned mean for the final layer)
        instead of weight samples.
      use_running_average: batch norm with its running statistics (evaluation);
        False normalizes by the batch's and updates ``batch_stats`` (training).
    """
    conv = conv_class(self.estimator)
    x = nn.with_logical_constraint(x, ("batch", None, None, None))
    if self.small_inputs:
      x = conv(self.width, (3, 3), padding="SAME", use_bias=False, kernel_axes=_CONV_AXES,
               name="stem")(x, deterministic)
    else:  # Keras' ZeroPadding2D((3, 3)) then a VALID 7x7 convolution
      x = conv(self.width, (7, 7), strides=2, padding=((3, 3), (3, 3)), use_bias=False,
               kernel_axes=_CONV_AXES, name="stem")(x, deterministic)
    x = nn.relu(_batch_norm("stem_norm")(x, use_running_average=use_running_average))
    if not self.small_inputs:  # zero padding after a ReLU is the same as -inf padding
      x = nn.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
    for stage, num_blocks in enumerate(self.stage_sizes):
      width = self.width * 2 ** stage
      for block in range(num_blocks):
        x = BottleneckBlock((width, width, 4 * width),
                            strides=2 if stage > 0 and block == 0 else 1,
                            projection=block == 0, estimator=self.estimator,
                            name=f"stage_{stage}_block_{block}")(x, deterministic,
                                                                 use_running_average)
    x = jnp.mean(x, axis=(1, 2))
    final = dict(kernel_axes=("embed", "vocab"), bias_axes=("vocab",), name="logits")
    if self.estimator == "deterministic":
      return dense_class("deterministic")(self.num_classes, **final)(x, deterministic)
    return DenseVariationalDropout(self.num_classes, **final)(x, deterministic)


def parameter_counts(model: nn.Module, image_shape: tuple[int, int, int] = (224, 224, 3)
                     ) -> dict[str, int]:
  """``count_parameters`` of the model's ``params`` from shapes alone (``jax.eval_shape``).

  Batch norm's running statistics (``batch_stats``) are not parameters.
  """
  shapes = jax.eval_shape(model.init, jax.random.key(0),
                          jax.ShapeDtypeStruct((1, *image_shape), jnp.float32))
  return dataclasses.asdict(count_parameters(shapes["params"])) | {
      "batch_norm_statistics": sum(int(np.prod(leaf.shape))
                                   for leaf in jax.tree.leaves(shapes.get("batch_stats", {})))}


@dataclasses.dataclass(frozen=True)
class ResNetConfig:
  """Settings of a run.

  Attributes:
    stage_sizes: blocks per stage of the small ResNet trained on digits.
    width: its first stage's bottleneck width.
    epochs: passes over the digits' training set.
    num_samples: Flipout forward passes averaged at evaluation.
    kl_weight: the KL term's weight in training (as in ``lenet_digits``).
    count_resnet50: count the full ResNet-50s (a few seconds of tracing).
    seed: seeds everything.
  """

  stage_sizes: tuple[int, ...] = (1, 1)
  width: int = 8
  epochs: int = 30
  num_samples: int = 20
  kl_weight: float = 0.1
  count_resnet50: bool = True
  seed: int = 0


def run(config: ResNetConfig, output_dir: str) -> dict[str, object]:
  """Counts the ResNet-50s, trains the small ResNets, writes the figure and the JSON."""
  results: dict[str, object] = {"config": dataclasses.asdict(config)}
  if config.count_resnet50:
    counts = {estimator: parameter_counts(ResNet(estimator=estimator))
              for estimator in ("deterministic", "flipout")}
    results["resnet50"] = counts | {
        "torchvision_parameters": TORCHVISION_RESNET50_PARAMETERS,
        "deterministic_matches_torchvision":
            counts["deterministic"]["total"] == TORCHVISION_RESNET50_PARAMETERS,
        "bayesian_over_deterministic":
            counts["flipout"]["total"] / counts["deterministic"]["total"]}

  x_train, y_train, x_test, y_test = load_digits_split(seed=config.seed)
  key = jax.random.key(config.seed)
  noise = np.asarray(jax.random.uniform(jax.random.fold_in(key, 1), x_test.shape))
  train_config = LeNetDigitsConfig(epochs=config.epochs, kl_weight=config.kl_weight,
                                   seed=config.seed)
  small = {}
  for estimator in ("deterministic", "flipout"):
    model = ResNet(stage_sizes=config.stage_sizes, width=config.width, num_classes=10,
                   estimator=estimator, small_inputs=True)
    variables, seconds = train(model, x_train, y_train, jax.random.fold_in(key, 2), train_config,
                               mutable_state=("batch_stats",),
                               train_kwargs={"use_running_average": False})
    key_eval = jax.random.fold_in(key, 3)
    metrics, _ = evaluate(
        sample_log_probs(model, variables, x_test, key_eval, config.num_samples), y_test,
        sample_log_probs(model, variables, noise, key_eval, config.num_samples))
    del metrics["reliability"]
    small[estimator] = metrics | {"train_seconds": seconds} | parameter_counts(
        model, x_train.shape[1:])
  results["small_resnet_digits"] = small

  os.makedirs(output_dir, exist_ok=True)
  _plot(os.path.join(output_dir, "resnet.png"), results)
  with open(os.path.join(output_dir, "resnet.json"), "w") as f:
    f.write(strict_json.dumps(results, null_reasons=strict_json.NULL_REASONS, indent=2))
  return results


def _plot(path: str, results: dict[str, object]) -> None:
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  panels = [(name, results[name]) for name in ("resnet50", "small_resnet_digits")
            if name in results]
  fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
  for ax, (name, counts) in zip(axes[0], panels):
    labels = ("deterministic", "flipout")
    bottom = np.zeros(2)
    for kind in ("bayesian_weights", "point_weights"):
      values = np.array([counts[label][kind] for label in labels], np.float64)
      ax.bar(labels, values, bottom=bottom, label=kind.replace("_", " "))
      bottom += values
    variational = np.array([counts[label]["total"] for label in labels], np.float64) - bottom
    ax.bar(labels, variational, bottom=bottom, label="posterior scales (and log σ²)")
    for i, label in enumerate(labels):
      text = f"{counts[label]['total']:,}"
      if "accuracy" in counts[label]:
        text += f"\nacc {counts[label]['accuracy']:.3f}"
      ax.text(i, counts[label]["total"], text, ha="center", va="bottom", fontsize="small")
    ax.set(ylabel="parameters", title=name.replace("_", " "))
    ax.margins(y=0.15)
    ax.legend(fontsize="small", loc="upper left")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def main(argv: Sequence[str] | None = None) -> dict[str, object]:
  defaults = ResNetConfig()
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--output_dir", default="runs/examples/resnet")
  parser.add_argument("--stage_sizes", type=int, nargs="+", default=list(defaults.stage_sizes))
  parser.add_argument("--width", type=int, default=defaults.width)
  parser.add_argument("--epochs", type=int, default=defaults.epochs)
  parser.add_argument("--num_samples", type=int, default=defaults.num_samples)
  parser.add_argument("--skip_resnet50", action="store_true",
                      help="do not count the full ResNet-50s (saves the tracing)")
  parser.add_argument("--seed", type=int, default=defaults.seed)
  args = parser.parse_args(argv)
  config = ResNetConfig(stage_sizes=tuple(args.stage_sizes), width=args.width,
                        epochs=args.epochs, num_samples=args.num_samples,
                        count_resnet50=not args.skip_resnet50, seed=args.seed)
  results = run(config, args.output_dir)
  print(strict_json.dumps({k: v for k, v in results.items() if k != "config"},
                         null_reasons=strict_json.NULL_REASONS, indent=2))
  return results


if __name__ == "__main__":
  main()
