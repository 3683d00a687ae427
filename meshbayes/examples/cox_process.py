"""A Cox process, deep GP intensity (the paper's Figure 8): coal-mining disasters, a 2-D pattern.

A ``PoissonProcess`` whose rate is ``base * softplus(f(x))``, ``f`` a deep GP of
``SparseGaussianProcess`` layers, fitted by its ELBO to the train half of each
pattern (split by thinning) and scored on the test half against a kernel
density and the constant rate. ``COAL_DISASTERS`` is the coal data. docs/examples.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
from collections.abc import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from meshbayes.examples import full_batch
from meshbayes.field_checks import positive_ints, positive_numbers
from meshbayes.layers import KL_COLLECTION, PoissonProcess, PoissonProcessDistribution, total_kl
from meshbayes.layers.gaussian_process import SparseGaussianProcess
from meshbayes.layers.poisson_process import quadrature_rule
from meshbayes.runtime import strict_json

Array = jax.Array
DATASETS = ("coal", "synthetic_2d")
COAL_WINDOW = (1851.0, 1962.25)  # decimal years; the last disaster is on 22 March 1962
THINNING_P = 0.5

# R's boot::coal (191 dates, decimal years, rounded here to 4 decimals, under an hour),
# read from the copy in pydataset 0.2.0 (resources/rdata/csv/boot/coal.csv): that package
# (16 MB, with pandas) is not a dependency for one column of numbers.
COAL_DISASTERS = np.array([
    1851.2026, 1851.6324, 1851.9692, 1851.9747, 1852.3142, 1852.3470, 1852.3580, 1852.3854,
    1852.9767, 1853.1958, 1853.2286, 1853.3190, 1853.4997, 1854.1348, 1856.3963, 1856.5058,
    1856.5387, 1856.6181, 1857.1383, 1857.4038, 1857.5818, 1858.0910, 1858.1540, 1858.4059,
    1858.9452, 1860.1253, 1860.1691, 1860.5907, 1860.8508, 1860.9192, 1860.9713, 1861.1848,
    1861.7379, 1861.8364, 1862.1376, 1862.8932, 1862.9370, 1863.1780, 1863.7940, 1863.9391,
    1863.9856, 1865.4586, 1865.9706, 1866.0637, 1866.3402, 1866.4524, 1866.8330, 1866.9480,
    1866.9507, 1867.6352, 1867.8542, 1867.8624, 1868.7495, 1868.9028, 1868.9877, 1869.2505,
    1869.4422, 1869.5544, 1869.8090, 1869.8747, 1870.1239, 1870.5154, 1870.5592, 1870.6331,
    1871.0274, 1871.1506, 1871.1670, 1871.7365, 1871.8159, 1872.1225, 1872.2402, 1872.7687,
    1873.1355, 1874.2854, 1874.5455, 1874.8877, 1874.9808, 1875.3285, 1875.9254, 1875.9309,
    1875.9309, 1876.9658, 1877.0643, 1877.1054, 1877.1903, 1877.7789, 1877.8090, 1878.1841,
    1878.1951, 1878.2361, 1878.4333, 1878.6961, 1879.0356, 1879.1725, 1879.5010, 1880.0568,
    1880.5387, 1880.6893, 1880.9439, 1881.1054, 1881.9678, 1882.1294, 1882.2964, 1882.2991,
    1882.3347, 1882.8522, 1883.7967, 1883.8515, 1884.0732, 1884.8563, 1885.1684, 1885.4641,
    1885.9788, 1886.6167, 1886.6934, 1886.7536, 1886.9206, 1887.1342, 1887.4052, 1888.2977,
    1889.0507, 1889.1985, 1889.7926, 1890.1020, 1890.1896, 1891.2519, 1891.6653, 1892.6537,
    1893.5079, 1894.4771, 1895.3176, 1896.0705, 1896.2841, 1896.3306, 1899.6297, 1901.3929,
    1902.6715, 1905.0561, 1905.1875, 1905.5243, 1906.7728, 1908.1362, 1908.2704, 1908.6290,
    1909.1273, 1909.8255, 1910.3566, 1910.9699, 1912.5195, 1913.7844, 1914.4086, 1916.6153,
    1918.0308, 1922.5291, 1922.6769, 1923.5695, 1927.1615, 1928.1143, 1930.1540, 1930.7481,
    1931.0767, 1931.8296, 1931.8843, 1932.0650, 1932.8645, 1932.8754, 1933.8830, 1934.7235,
    1935.6434, 1935.6954, 1936.5962, 1937.4997, 1938.3539, 1939.8214, 1940.2183, 1940.4237,
    1941.4203, 1941.5216, 1941.5736, 1942.0007, 1942.1294, 1942.4825, 1946.9452, 1947.0246,
    1947.6188, 1947.6379, 1947.6872, 1951.4052, 1957.8830, 1960.4894, 1962.2197,
])


@dataclasses.dataclass(frozen=True)
class CoxProcessConfig:
  """Settings of a run.

  Attributes:
    datasets: which patterns to fit, of ``coal`` and ``synthetic_2d``.
    num_layers: layers of the deep GP (1: a sparse GP).
    coal_inducing: inducing points of each layer on the coal data (evenly spaced).
    inducing_per_axis: inducing points per axis of each layer in 2-D (a grid).
    lengthscale_init: initial kernel lengthscale (the box is the unit box).
    hidden_scale_init: initial diagonal of ``L_S`` in the hidden layers.
    jitter: added to ``K(Z, Z)``'s diagonal (float32 Cholesky factors of grid-placed
      inducing points need more than the layer's default 1e-6).
    coal_quadrature: Gauss-Legendre nodes of the training integral on the coal data.
    quadrature_per_axis: Gauss-Legendre nodes per axis of the training integral in 2-D.
    steps: Adam steps per pattern, full batch.
    learning_rate: Adam's step size.
    num_samples: posterior draws of the rate for the mean and the band.
    grid: evaluation cells per axis (midpoints; the held-out integrals and the L2 error).
    seed: seeds the synthetic pattern, the split, the initialization and the draws.
  """

  datasets: tuple[str, ...] = DATASETS
  num_layers: int = 2
  coal_inducing: int = 32
  inducing_per_axis: int = 8
  lengthscale_init: float = 0.2
  hidden_scale_init: float = 0.1
  jitter: float = 1e-4
  coal_quadrature: int = 64
  quadrature_per_axis: int = 24
  steps: int = 2000
  learning_rate: float = 0.01
  num_samples: int = 200
  grid: int = 100
  seed: int = 0

  def __post_init__(self):
    unknown = [d for d in self.datasets if d not in DATASETS]
    if not self.datasets or unknown:
      raise ValueError(f"CoxProcessConfig: datasets={self.datasets!r} must be a non-empty "
                       f"subset of {', '.join(DATASETS)}")
    positive_ints("CoxProcessConfig", self, "num_layers", "coal_inducing", "inducing_per_axis",
                  "coal_quadrature", "quadrature_per_axis", "steps", "num_samples", "grid")
    positive_numbers("CoxProcessConfig", self, "lengthscale_init", "hidden_scale_init", "jitter",
                     "learning_rate")


def synthetic_intensity(x: Array) -> Array:
  """The 2-D truth: 60 plus bumps 3000 high at (0.3, 0.7), sd 0.1, and 1500 at (0.7, 0.3), sd 0.15.

  >>> [round(float(v)) for v in synthetic_intensity(jnp.array([[0.3, 0.7], [0.0, 0.0]]))]
  [3061, 60]
  """
  def bump(center, sd):
    return jnp.exp(-jnp.sum(jnp.square(x - jnp.asarray(center)), -1) / (2 * sd ** 2))
  return 60.0 + 3000.0 * bump((0.3, 0.7), 0.1) + 1500.0 * bump((0.7, 0.3), 0.15)


def load_pattern(name: str, seed: int) -> dict[str, np.ndarray]:
  """The pattern on the unit box, split by thinning: ``train``, ``test`` ``(n, d)`` float32."""
  if name == "coal":
    points = ((COAL_DISASTERS - COAL_WINDOW[0]) / (COAL_WINDOW[1] - COAL_WINDOW[0]))[:, None]
  else:
    truth = PoissonProcessDistribution(synthetic_intensity, low=(0.0, 0.0), high=(1.0, 1.0),
                                       rate_bound=3100.0, max_points=4096)
    sampled, mask, diagnostics = jax.jit(truth.sample_with_diagnostics)(jax.random.key(seed))
    diagnostics.check_bound()  # an exact sample of the truth, or a one-line error
    points = np.asarray(sampled)[np.asarray(mask)]
  keep = np.random.default_rng(seed).random(len(points)) < THINNING_P
  return {"train": points[keep].astype(np.float32), "test": points[~keep].astype(np.float32)}


def _fixed(value: np.ndarray) -> Callable:
  """An initializer returning ``value`` (inducing inputs on a grid)."""
  return lambda key, shape, dtype=jnp.float32: jnp.asarray(value, dtype).reshape(shape)


class DeepGPRate(nn.Module):
  """``base * softplus(f(x))``, ``f`` a deep GP; one sample of ``f`` per location (mean at init).

  Attributes:
    inducing_inputs: initial inducing inputs ``(M, d)`` of every layer.
    num_layers: sparse GP layers; the hidden ones have width ``d``, identity mean.
    base_rate: the rate at ``f = 0`` (``softplus(0) = log 2`` divided out).
    lengthscale_init: initial kernel lengthscale.
    hidden_scale_init: initial diagonal of ``L_S`` in the hidden layers.
    jitter: added to ``K(Z, Z)``'s diagonal.
  """

  inducing_inputs: np.ndarray
  num_layers: int
  base_rate: float
  lengthscale_init: float
  hidden_scale_init: float = 0.1
  jitter: float = 1e-4

  @nn.compact
  def __call__(self, x: Array) -> Array:
    h, width = x, x.shape[-1]
    for i in range(self.num_layers):
      last = i == self.num_layers - 1
      h = SparseGaussianProcess(
          units=1 if last else width, num_inducing=len(self.inducing_inputs),
          lengthscale_init=self.lengthscale_init, mean_fn=None if last else (lambda t: t),
          inducing_inputs_init=_fixed(self.inducing_inputs),
          scale_init=1.0 if last else self.hidden_scale_init, jitter=self.jitter,
          name=f"layer_{i}")(h)
    f = h.mean()
    if self.has_rng("sample"):  # the ELBO's and the posterior's draws; init uses the mean
      f = f + h.stddev() * jax.random.normal(self.make_rng("sample"), f.shape)
    return self.base_rate / math.log(2.0) * jax.nn.softplus(f[..., 0])


def grid_midpoints(cells: int, ndim: int) -> np.ndarray:
  """Midpoints of ``cells ** ndim`` equal cells of the unit box, ``(cells ** ndim, ndim)``."""
  return quadrature_rule((0.0,) * ndim, (1.0,) * ndim, cells, "midpoint")[0].astype(np.float32)


def build_process(name: str, train: np.ndarray, config: CoxProcessConfig) -> PoissonProcess:
  """The Cox process of one pattern: the deep GP rate in a ``PoissonProcess`` on the unit box."""
  ndim = train.shape[1]
  per_axis = config.coal_inducing if name == "coal" else config.inducing_per_axis
  inducing = grid_midpoints(per_axis, ndim)
  rate = DeepGPRate(inducing_inputs=inducing, num_layers=config.num_layers,
                    base_rate=float(len(train)),  # n_train / |B|, the unit box's volume 1
                    lengthscale_init=config.lengthscale_init,
                    hidden_scale_init=config.hidden_scale_init, jitter=config.jitter)
  order = config.coal_quadrature if name == "coal" else config.quadrature_per_axis
  return PoissonProcess(rate=rate, low=(0.0,) * ndim, high=(1.0,) * ndim, quadrature_order=order)


def train(process: PoissonProcess, points: np.ndarray, key: Array, config: CoxProcessConfig
          ) -> tuple[dict, list[float], float]:
  """Adam on the negative ELBO per training point; returns parameters, curve, seconds."""
  points = jnp.asarray(points)
  key_init, key_train = jax.random.split(key)
  params = nn.unbox(jax.jit(process.init)(key_init)["params"])

  def loss_fn(params, key):
    log_prob, state = process.apply({"params": params}, rngs={"sample": key},
                                    mutable=[KL_COLLECTION],
                                    method=lambda m: m().log_prob(points))
    return (total_kl(state) - log_prob) / len(points)

  return full_batch.fit(loss_fn, params, config.learning_rate, key_train, config.steps)


def posterior_rates(process: PoissonProcess, params: dict, x: np.ndarray, key: Array,
                    num_samples: int) -> np.ndarray:
  """``num_samples`` draws of the rate at ``x`` ``(n, d)``: ``(num_samples, n)``."""
  def one(k):
    return process.apply({"params": params}, rngs={"sample": k},
                         method=lambda m: m.rate(jnp.asarray(x)))
  return np.asarray(jax.jit(lambda ks: jax.lax.map(one, ks))(jax.random.split(key, num_samples)),
                    np.float64)


def held_out_log_likelihood(rate_at_test: np.ndarray, rate_on_grid: np.ndarray) -> float:
  """``(sum log rate(test) - integral rate) / n_test``, the integral by the grid's midpoints.

  >>> held_out_log_likelihood(np.full(4, 2.0), np.full(10, 2.0))   # (4 log 2 - 2) / 4
  0.1931471805599453
  """
  return float((np.sum(np.log(rate_at_test)) - np.mean(rate_on_grid)) / len(rate_at_test))


def kernel_density_rate(train: np.ndarray, seed: int) -> tuple[Callable[[np.ndarray], np.ndarray],
                                                                float]:
  """A Gaussian KDE of ``train`` times its count, bandwidth by 5-fold CV likelihood on ``train``."""
  from sklearn.model_selection import GridSearchCV, KFold  # pylint: disable=import-outside-toplevel
  from sklearn.neighbors import KernelDensity  # pylint: disable=import-outside-toplevel
  search = GridSearchCV(KernelDensity(kernel="gaussian"),
                        {"bandwidth": np.geomspace(0.005, 0.5, 30)},
                        cv=KFold(5, shuffle=True, random_state=seed))
  search.fit(train.astype(np.float64))
  kde, count = search.best_estimator_, len(train)
  return (lambda x: count * np.exp(kde.score_samples(np.asarray(x, np.float64))),
          float(kde.bandwidth))


def fit_pattern(name: str, config: CoxProcessConfig, key: Array) -> dict[str, object]:
  """Trains on the train half, scores on the test half; returns the metrics and the curves."""
  data = load_pattern(name, config.seed)
  ndim = data["train"].shape[1]
  process = build_process(name, data["train"], config)
  params, curve, seconds = train(process, data["train"], key, config)
  grid = grid_midpoints(config.grid, ndim)
  draws = posterior_rates(process, params, np.concatenate([grid, data["test"]]),
                          jax.random.fold_in(key, 1), config.num_samples)
  mean, low, high = draws.mean(0), np.quantile(draws, 0.05, 0), np.quantile(draws, 0.95, 0)
  n_grid = len(grid)
  kde, bandwidth = kernel_density_rate(data["train"], config.seed)
  kde_grid, kde_test = kde(grid), kde(data["test"])
  constant = float(len(data["train"]))  # the train half's count over the unit volume
  held_out = {
      "cox_process": held_out_log_likelihood(mean[n_grid:], mean[:n_grid]),
      "kernel_density": held_out_log_likelihood(kde_test, kde_grid),
      "constant_rate": held_out_log_likelihood(np.full(len(data["test"]), constant),
                                               np.full(n_grid, constant)),
  }
  # The held-out gap to the KDE is a sum over test points plus a constant (the integrals):
  # its per-point standard error is that of the paired log-rate differences.
  log_ratio = np.log(mean[n_grid:]) - np.log(kde_test)
  result: dict[str, object] = {
      "num_points": len(data["train"]) + len(data["test"]), "num_train": len(data["train"]),
      "num_test": len(data["test"]), "train_seconds": seconds, "final_negative_elbo": curve[-1],
      "negative_elbo_every_20_steps": curve, "kde_bandwidth": bandwidth,
      "held_out_log_likelihood_per_test_point": held_out,
      "held_out_gap_to_kde_standard_error": float(np.std(log_ratio, ddof=1)
                                                  / math.sqrt(len(log_ratio))),
      "expected_count_train_half": float(np.mean(mean[:n_grid])),
  }
  # Intensities of the whole pattern: the train half's fit over the thinning probability.
  whole = {"mean": mean[:n_grid] / THINNING_P, "low": low[:n_grid] / THINNING_P,
           "high": high[:n_grid] / THINNING_P, "kde": kde_grid / THINNING_P,
           "constant": np.full(n_grid, constant / THINNING_P)}
  if name == "synthetic_2d":
    truth = np.asarray(synthetic_intensity(jnp.asarray(grid)), np.float64)
    norm = np.sqrt(np.mean(np.square(truth)))
    result["relative_l2_error"] = {
        method: float(np.sqrt(np.mean(np.square(whole[key_] - truth))) / norm)
        for method, key_ in (("cox_process", "mean"), ("kernel_density", "kde"),
                             ("constant_rate", "constant"))}
    result["coverage_90"] = float(np.mean((truth >= whole["low"]) & (truth <= whole["high"])))
    result["peak_intensity"] = {"truth": float(truth.max()),
                                "cox_process": float(whole["mean"].max()),
                                "kernel_density": float(whole["kde"].max())}
    whole["truth"] = truth
  result["_plot"] = {"grid": grid, "data": data, **whole}
  return result


def run(config: CoxProcessConfig, output_dir: str) -> dict[str, object]:
  """Fits each pattern of ``config.datasets``, writes the figure and JSON; returns the numbers."""
  key = jax.random.key(config.seed)
  results: dict[str, object] = {"config": dataclasses.asdict(config), "thinning_p": THINNING_P,
                                "coal_window": COAL_WINDOW}
  plots = {}
  for index, name in enumerate(config.datasets):
    fitted = fit_pattern(name, config, jax.random.fold_in(key, index))
    plots[name] = fitted.pop("_plot")
    results[name] = fitted
  os.makedirs(output_dir, exist_ok=True)
  _plot(os.path.join(output_dir, "cox_process.png"), plots, results, config.grid)
  with open(os.path.join(output_dir, "cox_process.json"), "w") as f:
    f.write(strict_json.dumps(results, null_reasons=strict_json.NULL_REASONS, indent=2))
  return results


def _plot(path: str, plots: dict, results: dict, cells: int) -> None:
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  panels = ("coal" in plots) + 3 * ("synthetic_2d" in plots)
  fig, axes = plt.subplots(1, panels, figsize=(5.2 * panels, 4.2), squeeze=False)
  axes = list(axes[0])
  if "coal" in plots:
    ax, p = axes.pop(0), plots["coal"]
    span = COAL_WINDOW[1] - COAL_WINDOW[0]
    years = COAL_WINDOW[0] + span * p["grid"][:, 0]
    ax.fill_between(years, p["low"] / span, p["high"] / span, alpha=0.3, label="90% band")
    ax.plot(years, p["mean"] / span, label="posterior mean")
    ax.plot(years, p["kde"] / span, color="gray", linestyle="--", linewidth=1, label="KDE")
    for part, y, color in (("train", -0.12, "tab:red"), ("test", -0.25, "tab:green")):
      ax.plot(COAL_WINDOW[0] + span * p["data"][part][:, 0], np.full(len(p["data"][part]), y),
              "|", color=color, label=f"{part} half")
    r = results["coal"]["held_out_log_likelihood_per_test_point"]
    ax.set(xlabel="year", ylabel="disasters per year",
           title=f"coal: held-out LL/pt {r['cox_process']:.3f} (KDE {r['kernel_density']:.3f})")
    ax.title.set_fontsize("small")
    ax.legend(fontsize="x-small")
  if "synthetic_2d" in plots:
    p, r = plots["synthetic_2d"], results["synthetic_2d"]
    image = lambda values: values.reshape(cells, cells).T  # grid is x-major; rows are y
    top = float(max(p["truth"].max(), p["mean"].max()))
    for ax, values, title in (
        (axes[0], p["truth"], "2-D truth"),
        (axes[1], p["mean"], f"posterior mean: rel. L2 {r['relative_l2_error']['cox_process']:.3f}"
                             f" (KDE {r['relative_l2_error']['kernel_density']:.3f})"),
        (axes[2], p["high"] - p["low"], f"90% band width: coverage {r['coverage_90']:.2f}")):
      shown = ax.imshow(image(values), origin="lower", extent=(0, 1, 0, 1), cmap="viridis",
                        interpolation="nearest", vmin=0.0,
                        vmax=top if ax is not axes[2] else None)
      fig.colorbar(shown, ax=ax, fraction=0.046)
      for part, color in (("train", "tab:red"), ("test", "white")):
        ax.scatter(*p["data"][part].T, s=2, color=color, alpha=0.7, label=f"{part} half")
      ax.set_title(title, fontsize="small")
    axes[0].legend(fontsize="x-small", loc="lower left", facecolor="lightgray")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def main(argv: Sequence[str] | None = None) -> dict[str, object]:
  defaults = CoxProcessConfig()
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--output_dir", default="runs/examples/cox_process")
  parser.add_argument("--datasets", nargs="+", default=list(defaults.datasets), choices=DATASETS)
  for field in dataclasses.fields(CoxProcessConfig):
    if field.name != "datasets":
      parser.add_argument(f"--{field.name}", type=type(getattr(defaults, field.name)),
                          default=getattr(defaults, field.name))
  args = vars(parser.parse_args(argv))
  output_dir = args.pop("output_dir")
  config = CoxProcessConfig(**{**args, "datasets": tuple(args["datasets"])})
  results = run(config, output_dir)
  printed = {name: {k: v for k, v in results[name].items() if k != "negative_elbo_every_20_steps"}
             for name in config.datasets}
  print(strict_json.dumps(printed, null_reasons=strict_json.NULL_REASONS, indent=2))
  return results


if __name__ == "__main__":
  main()
