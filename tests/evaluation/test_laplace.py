"""Last-layer Laplace: closed forms (a linear-Gaussian last layer, where Laplace is exact),
the softmax GGN against jax.hessian, the posterior kind, the prior precision's selection,
and the fit of a trained Transformer."""

import math
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from meshbayes.evaluation import laplace
from meshbayes.layers import as_posterior
from meshbayes.models.transformer import Transformer, TransformerConfig
from meshbayes.models.transformer.config import Estimators
from tests.models.synthetic import make_batch


# A linear-Gaussian last layer: y = H @ W + N(0, sigma^2), prior W ~ N(0, 1 / alpha).
N, D, V, SIGMA2, ALPHA = 12, 3, 2, 0.3, 0.7


def linear_gaussian_problem():
  rng = np.random.default_rng(0)
  features = rng.normal(size=(N, D))
  targets = features @ rng.normal(size=(D, V)) + rng.normal(scale=math.sqrt(SIGMA2), size=(N, V))
  return features, targets


def conjugate_posterior(features, targets):
  """The exact posterior of each column of W: N(mu, Sigma), in numpy float64."""
  covariance = np.linalg.inv(features.T @ features / SIGMA2 + ALPHA * np.eye(D))
  return covariance @ features.T @ targets / SIGMA2, covariance


def test_linear_gaussian_laplace_at_the_map_is_the_conjugate_posterior():
  features, targets = linear_gaussian_problem()
  mean, covariance = conjugate_posterior(features, targets)
  with jax.enable_x64(True):
    h, y = jnp.asarray(features), jnp.asarray(targets)

    def negative_log_joint(flat):
      w = flat.reshape(D, V)
      return jnp.sum((y - h @ w) ** 2) / (2 * SIGMA2) + ALPHA / 2 * jnp.sum(w ** 2)

    flat = jnp.zeros(D * V)
    for _ in range(3):  # Newton's method: exact after one step on a quadratic
      flat = flat - jnp.linalg.solve(jax.hessian(negative_log_joint)(flat),
                                     jax.grad(negative_log_joint)(flat))
    hessian = np.asarray(jax.hessian(negative_log_joint)(flat)).reshape(D, V, D, V)
    ggn = laplace.gaussian_ggn(h, SIGMA2)
    precision = laplace.full_posterior_precision(ggn, ALPHA)
    laplace_covariance = laplace.full_posterior_covariance(ggn, ALPHA)
    assert ggn.dtype == precision.dtype == laplace_covariance.dtype == jnp.float64
    np.testing.assert_allclose(np.asarray(flat).reshape(D, V), mean, rtol=1e-9)
    for v in range(V):  # the Hessian at the MAP: one block per output column, none across
      for u in range(V):
        expected = np.asarray(precision) if u == v else np.zeros((D, D))
        np.testing.assert_allclose(hessian[:, v, :, u], expected, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(laplace_covariance, covariance, rtol=1e-9)
    # The diagonal Laplace keeps the exact precision's diagonal, for every column...
    diagonal = laplace.diagonal_posterior_precision(
        laplace.diagonal_ggn_gaussian(h, SIGMA2, V), ALPHA)
    np.testing.assert_allclose(diagonal, np.repeat(np.diag(precision)[:, None], V, 1), rtol=1e-12)
    stddev = np.asarray(laplace.diagonal_posterior_stddev(
        laplace.diagonal_ggn_gaussian(h, SIGMA2, V), ALPHA))
    np.testing.assert_allclose(stddev, 1 / np.sqrt(diagonal), rtol=1e-12)
  # ...so its variances are the conditional ones, below the marginals (features correlate).
  assert np.all(stddev[:, 0] ** 2 < np.diag(covariance))


def test_gaussian_ggn_mask_and_scale():
  """A masked row drops out; ggn_scale multiplies the GGN, not the prior."""
  features, _ = linear_gaussian_problem()
  mask = np.ones(N)
  mask[[2, 7]] = 0.0
  kept = features[mask > 0]
  np.testing.assert_allclose(laplace.gaussian_ggn(jnp.asarray(features, jnp.float32), SIGMA2,
                                                  jnp.asarray(mask)),
                             kept.T @ kept / SIGMA2, rtol=1e-5)
  np.testing.assert_allclose(
      laplace.diagonal_ggn_gaussian(jnp.asarray(features, jnp.float32), SIGMA2, V,
                                    jnp.asarray(mask))[:, 1],
      np.sum(kept ** 2, 0) / SIGMA2, rtol=1e-5)
  ggn = laplace.gaussian_ggn(jnp.asarray(features, jnp.float32), SIGMA2)
  np.testing.assert_allclose(laplace.full_posterior_precision(ggn, 2.0, ggn_scale=5.0),
                             5.0 * np.asarray(ggn) + 2.0 * np.eye(D), rtol=1e-6)
  np.testing.assert_allclose(laplace.diagonal_posterior_precision(jnp.ones(3), 2.0, 5.0),
                             [7.0, 7.0, 7.0])


def softmax_problem(seed=0, batch=2, length=3, d=3, v=4):
  rng = np.random.default_rng(seed)
  features = jnp.asarray(rng.normal(size=(batch, length, d)), jnp.float32)
  kernel = jnp.asarray(rng.normal(size=(d, v)), jnp.float32)
  targets = jnp.asarray(rng.integers(0, v, size=(batch, length)))
  mask = jnp.asarray(rng.integers(0, 2, size=(batch, length)), jnp.float32).at[0, 0].set(1.0)
  return features, kernel, targets, mask


def summed_cross_entropy(kernel, features, targets, mask):
  log_probs = jax.nn.log_softmax(features @ kernel)
  return -jnp.sum(mask * jnp.take_along_axis(log_probs, targets[..., None], -1)[..., 0])


def test_softmax_ggn_is_the_cross_entropy_hessian_and_its_diagonal_matches():
  features, kernel, targets, mask = softmax_problem()
  d, v = kernel.shape
  hessian = jax.hessian(summed_cross_entropy)(kernel, features, targets, mask)  # (d, v, d, v)
  # The full GGN J^T (diag(p) - p p^T) J, written out: equal to the Hessian, for the
  # logits are linear in the kernel.
  probs = jax.nn.softmax(features @ kernel)
  output_hessian = jnp.einsum("btv,vu->btvu", probs, jnp.eye(v)) - jnp.einsum(
      "btv,btu->btvu", probs, probs)
  ggn = jnp.einsum("bt,btj,btk,btvu->jvku", mask, features, features, output_hessian)
  np.testing.assert_allclose(hessian, ggn, rtol=1e-4, atol=1e-5)
  diagonal = laplace.diagonal_ggn_softmax(features, features @ kernel, mask)
  assert diagonal.shape == (d, v) and diagonal.dtype == jnp.float32
  expected = np.einsum("jvjv->jv", np.asarray(hessian))
  np.testing.assert_allclose(diagonal, expected, rtol=1e-5, atol=1e-6)
  assert float(jnp.min(expected)) > 0  # a real check, not zeros against zeros
  # Probabilities in place of logits (their log) give the same.
  np.testing.assert_allclose(laplace.diagonal_ggn_softmax(features, jnp.log(probs), mask),
                             diagonal, rtol=1e-5)
  # The targets do not enter the GGN: another set of targets, the same Hessian.
  other = jax.hessian(summed_cross_entropy)(kernel, features, (targets + 1) % v, mask)
  np.testing.assert_allclose(other, hessian, rtol=1e-5, atol=1e-6)


def test_softmax_ggn_excludes_masked_tokens_and_weighs_the_rest():
  features, kernel, _, mask = softmax_problem(seed=1)
  logits = features @ kernel
  diagonal = laplace.diagonal_ggn_softmax(features, logits, mask)
  # Garbage at masked tokens changes nothing.
  garbage = jnp.where(mask[..., None] > 0, features, 1e3)
  np.testing.assert_array_equal(
      laplace.diagonal_ggn_softmax(garbage, jnp.where(mask[..., None] > 0, logits, -7.0), mask),
      diagonal)
  # The kept tokens alone, with no mask: the same sums.
  kept = mask > 0
  np.testing.assert_allclose(laplace.diagonal_ggn_softmax(features[kept], logits[kept]),
                             diagonal, rtol=1e-6)
  # No mask counts every token; a weight of 2 counts a token twice.
  all_tokens = laplace.diagonal_ggn_softmax(features, logits)
  assert float(jnp.sum(all_tokens)) > float(jnp.sum(diagonal))
  np.testing.assert_allclose(laplace.diagonal_ggn_softmax(features, logits, 2 * mask),
                             2 * diagonal, rtol=1e-6)


def test_accumulating_two_batches_equals_one_batch_of_both():
  features_a, kernel, _, mask_a = softmax_problem(seed=2)
  features_b, _, _, mask_b = softmax_problem(seed=3)
  sums = laplace.zero_ggn_sums(*kernel.shape)
  add = jax.jit(laplace.add_softmax_batch)
  sums = add(sums, features_a, features_a @ kernel, mask_a)
  sums = add(sums, features_b, features_b @ kernel, mask_b)
  both = jnp.concatenate([features_a, features_b])
  mask = jnp.concatenate([mask_a, mask_b])
  np.testing.assert_allclose(sums.diagonal,
                             laplace.diagonal_ggn_softmax(both, both @ kernel, mask), rtol=1e-6)
  assert float(sums.total_weight) == float(jnp.sum(mask)) > 0


@pytest.mark.parametrize("call, message", [
    (lambda: laplace.diagonal_ggn_softmax(jnp.ones((2, 3)), jnp.ones((4, 5))),
     r"diagonal_ggn_softmax: features \(2, 3\) and logits \(4, 5\)"),
    (lambda: laplace.diagonal_ggn_softmax(jnp.ones((2, 3)), jnp.ones((2, 5)), jnp.ones(3)),
     r"mask \(3,\) must have the features' leading shape \(2,\)"),
    (lambda: laplace.diagonal_posterior_stddev(jnp.ones(2), 0.0),
     r"prior_precision=0.0 must be positive"),
    (lambda: laplace.diagonal_posterior_stddev(jnp.ones(2), 1.0, ggn_scale=float("nan")),
     r"ggn_scale=nan must be positive"),
    (lambda: laplace.full_posterior_covariance(jnp.ones((2, 3)), 1.0),
     r"ggn \(2, 3\) must be a square matrix"),
])
def test_bad_arguments_are_one_line_errors(call, message):
  with pytest.raises(ValueError, match=message) as error:
    call()
  assert "\n" not in str(error.value)


def test_the_last_layer_posterior_samples_the_layer_alone_with_its_moments():
  params = {"body": {"w": jnp.arange(6.0).reshape(2, 3).astype(jnp.bfloat16), "b": jnp.ones(3)},
            "out": {"kernel": jnp.ones((3, 4))}}
  layer_stddev = jnp.linspace(0.1, 1.2, 12).reshape(3, 4)
  posterior = laplace.LastLayerPosterior(params, layer_stddev, ("out", "kernel"))
  assert as_posterior(posterior) is posterior and posterior.mean_weights() is params
  assert posterior.sampled_axes() == {"body": {"w": None, "b": None}, "out": {"kernel": 0}}
  samples = posterior.stacked(jax.random.split(jax.random.key(0), 20_000))
  for name in ("w", "b"):  # not stacked: bit for bit, bfloat16 included
    assert samples["body"][name].dtype == params["body"][name].dtype
    np.testing.assert_array_equal(samples["body"][name], params["body"][name])
  kernel = np.asarray(samples["out"]["kernel"])
  assert kernel.shape == (20_000, 3, 4)
  assert np.all(np.abs(kernel.mean(0) - 1.0) < 4 * np.asarray(layer_stddev) / math.sqrt(20_000))
  np.testing.assert_allclose(kernel.std(0), layer_stddev, rtol=0.03)


def test_transformer_output_kernel_from_captured_features():
  """The wiring evaluation uses: the decoder's final norm output is ``h``, ``h @ kernel``
  the logits, and a sample of the last-layer posterior changes ``logits_dense`` alone."""
  config = TransformerConfig(vocab_size=16, emb_dim=8, num_heads=2, head_dim=4,
                             num_encoder_layers=1, num_decoder_layers=1, mlp_dim=16,
                             estimators=Estimators.deterministic())
  model = Transformer(config)
  tokens = jnp.asarray(np.random.default_rng(0).integers(1, 16, size=(2, 5)), jnp.int32)
  params = nn.unbox(model.init(jax.random.key(0), tokens, tokens))["params"]

  @jax.jit
  def features_and_logits(params):
    logits, state = model.apply(
        {"params": params}, tokens, tokens, tokens, deterministic=True,
        capture_intermediates=lambda module, method: module.name == "decoder_norm",
        mutable=["intermediates"])
    return state["intermediates"]["decoder"]["decoder_norm"]["__call__"][0], logits

  features, logits = features_and_logits(params)
  kernel = params["decoder"]["logits_dense"]["kernel"]
  np.testing.assert_allclose(features @ kernel, logits, rtol=1e-5, atol=1e-5)
  ggn = laplace.diagonal_ggn_softmax(features, logits, (tokens > 0).astype(jnp.float32))
  path = ("decoder", "logits_dense", "kernel")
  posterior = laplace.LastLayerPosterior(params, laplace.diagonal_posterior_stddev(ggn, 1.0),
                                         path)
  sample = posterior.sample(jax.random.key(1))
  changed = [jax.tree_util.keystr(leaf_path) for (leaf_path, mean), drawn
             in zip(jax.tree_util.tree_leaves_with_path(params), jax.tree.leaves(sample))
             if not np.array_equal(mean, drawn)]
  assert changed == ["['decoder']['logits_dense']['kernel']"]


def test_prior_precision_selection_finds_the_grid_minimum_of_a_convex_function():
  calls = []

  def nll(alpha):
    calls.append(alpha)
    return (math.log10(alpha) - math.log10(3.0)) ** 2  # least at 3: nearest on the grid 10^0.5

  choice = laplace.select_prior_precision(nll)
  assert choice.prior_precision == pytest.approx(10 ** 0.5, rel=1e-12)
  assert calls == sorted(calls) and len(calls) == 17
  assert calls[0] == pytest.approx(1e-4) and calls[-1] == pytest.approx(1e4)
  assert [alpha for alpha, _ in choice.validation_nlls] == calls
  assert choice.validation_nlls[8] == (1.0, pytest.approx(math.log10(3.0) ** 2))


@pytest.mark.parametrize("nll, grid, expected", [
    (lambda a: -a, None, 1e4),  # decreasing: the largest
    (lambda a: a, None, 1e-4),  # increasing: the smallest
    (lambda a: 1.0, None, 1e4),  # constant: every tie goes to the larger
    (lambda a: {1.0: 0.5, 2.0: 0.2, 4.0: 0.2, 8.0: 0.9}[a], (8.0, 1.0, 4.0, 2.0), 4.0),
    (lambda a: float("nan") if a > 1 else 3.0 - a, (0.5, 1, 2, 4), 1.0),  # NaN loses
    (lambda a: 1.0, (2.0, 2.0, 2), 2.0),  # duplicates run once
])
def test_prior_precision_selection_edge_cases(nll, grid, expected):
  choice = laplace.select_prior_precision(nll, *(() if grid is None else (grid,)))
  assert choice.prior_precision == pytest.approx(expected, rel=1e-12)
  if grid is not None:
    assert len(choice.validation_nlls) == len(set(float(g) for g in grid))


@pytest.mark.parametrize("grid, message", [
    ((), "the grid of prior precisions is empty"),
    ((1.0, 0.0), "grid value 0.0 must be a positive, finite number"),
    ((-2, 1.0), "grid value -2 must be"),
    ((1.0, float("inf")), "grid value inf must be"),
    ((float("nan"),), "grid value nan must be"),
    ((True,), "grid value True must be"),
    (("1",), "grid value '1' must be"),
])
def test_prior_precision_selection_rejects_bad_grids(grid, message):
  calls = []
  with pytest.raises(ValueError, match=message) as error:
    laplace.select_prior_precision(lambda a: calls.append(a) or 0.0, grid)
  assert "\n" not in str(error.value) and not calls


def test_prior_precision_selection_with_no_numeric_nll_is_an_error():
  with pytest.raises(ValueError, match="validation_nll gave no number on the grid") as error:
    laplace.select_prior_precision(lambda a: float("nan"), (1.0, 2.0))
  assert "\n" not in str(error.value)


def test_prior_precision_may_be_traced():
  """Under jit the precision is not checked but used: one compiled posterior for the grid."""
  stddev = jax.jit(lambda alpha: laplace.diagonal_posterior_stddev(jnp.full(2, 3.0), alpha))
  np.testing.assert_allclose(stddev(1.0), [0.5, 0.5], rtol=1e-6)
  np.testing.assert_allclose(stddev(13.0), [0.25, 0.25], rtol=1e-6)


class _Data:
  """Two batches of each split of the synthetic reversal task, as ``TaskData`` gives them."""

  task, batch_size, feature_lengths = "fake", 8, {"inputs": 6, "targets": 6}

  def eval_batches(self, layout, split):
    del layout
    rng = np.random.default_rng({"train": 1, "validation": 2}[split])
    return [make_batch(rng, self.batch_size, 6, 8) for _ in range(2)]


def test_fit_sums_the_training_curvature_and_picks_the_prior_on_validation(monkeypatch, capsys):
  from meshbayes.evaluation import methods as predictive_methods
  from meshbayes.data import pipeline
  from meshbayes.models.encoder_decoder import EncoderDecoderModel
  from meshbayes.partitioning import Partitioner

  monkeypatch.setattr(pipeline, "train_set_size", lambda task, lengths, unit: 1000)
  config = TransformerConfig(vocab_size=8, emb_dim=16, num_heads=2, head_dim=8,
                             num_encoder_layers=1, num_decoder_layers=1, mlp_dim=32,
                             dropout_rate=0.0, estimators=Estimators.deterministic())
  model = EncoderDecoderModel(config, num_train_units=1000.0)
  data = _Data()
  shapes = {k: v.shape for k, v in data.eval_batches(None, "train")[0].items()}
  params = jax.jit(lambda k: nn.unbox(model.get_initial_variables(k, shapes)["params"]))(
      jax.random.key(0))
  inputs = predictive_methods.MethodInputs(
      "runs/det", 3, context=predictive_methods.EvalContext(data, Partitioner(), 0))
  fitted_model, posterior = predictive_methods.get("laplace").build(model, params, inputs)
  assert fitted_model is model and isinstance(posterior, laplace.LastLayerPosterior)
  assert posterior.path == laplace.OUTPUT_KERNEL and posterior.params is params
  # The curvature, summed here directly from the features and logits of the train batches.
  diagonal, tokens = 0.0, 0.0
  for batch in data.eval_batches(None, "train"):
    logits, state = model.module.apply(
        {"params": params}, batch["encoder_input_tokens"], batch["decoder_input_tokens"],
        batch["decoder_target_tokens"], deterministic=True, mutable=["intermediates"],
        capture_intermediates=lambda module, _: module.name == "decoder_norm")
    features = state["intermediates"]["decoder"]["decoder_norm"]["__call__"][0]
    diagonal = diagonal + laplace.diagonal_ggn_softmax(features, logits,
                                                       batch["decoder_loss_weights"])
    tokens += float(batch["decoder_loss_weights"].sum())
  line = next(line for line in capsys.readouterr().err.splitlines()
              if line.startswith("laplace: prior precision"))
  chosen = float(re.match(r"laplace: prior precision (\S+) ", line).group(1))
  nlls = {float(a): float(n) for a, n in re.findall(r"(\S+): (\d+\.\d+)", line)}
  assert sorted(nlls) == pytest.approx(laplace.EVALUATION_PRIOR_PRECISIONS)
  assert nlls[chosen] == min(nlls.values())
  np.testing.assert_allclose(
      posterior.stddev, laplace.diagonal_posterior_stddev(diagonal, chosen, 1000 / tokens),
      rtol=1e-5)
  # Only the output kernel varies between members; scoring averages them.
  _, aux = model.score_batch(posterior, jax.tree.map(jnp.asarray, make_batch(
      np.random.default_rng(3), 8, 6, 8)), jax.random.key(0), num_samples=3)
  assert aux["sample_log_probs"].shape == (3, 8)
  assert float(jnp.std(aux["sample_log_probs"], axis=0).max()) > 0


def test_fit_refuses_what_has_no_deterministic_output_projection():
  from meshbayes.evaluation import methods as predictive_methods

  class Bayesian:
    is_bayesian, config = True, None

  inputs = predictive_methods.MethodInputs("runs/bayes", 2)
  with pytest.raises(ValueError, match=r"^laplace: needs a deterministic run with its own output "
                                       r"projection \(not Bayesian or IVON, "
                                       r"logits_via_embedding=False\)$"):
    laplace.fit(Bayesian(), {}, inputs)
