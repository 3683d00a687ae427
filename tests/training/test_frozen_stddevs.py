"""The noise-without-KL control (``meshbayes.training.frozen_stddevs``, issue 69): posterior
stddevs frozen at another run's, the rest trained as the Bayesian layers' recipe trains it.

The unit tests step a tiny Bayesian Transformer under the recipe's optimizer (AdamW, weight
decay, global-norm clipping, the scales' learning rate x10) and its prior (fan-in scaled,
0.5) and compare with steps computed here with the scales as constants; the integration
tests train tiny runs through ``meshbayes.train`` and evaluate them through
``meshbayes.eval``.
"""

import functools
import json
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import traverse_util

from meshbayes.evaluation import methods as predictive_methods
from meshbayes.models import EncoderDecoderModel
from meshbayes.models.transformer import TransformerConfig
from meshbayes.runtime import gin_preflight, strict_json
from meshbayes.training import checkpoints as checkpoints_lib
from meshbayes.training import frozen_stddevs
from meshbayes.training.optimizers import KLWeight, LearningRate, Optimizer
from meshbayes.training.run_configs import CheckpointConfig
from meshbayes.training.train_step import StepFunctions, TrainState, init_train_state
from tests.training.runs import command, eval_args, one_line, train, train_args, train_or_fail

CONFIG = TransformerConfig(vocab_size=32, emb_dim=16, num_heads=2, head_dim=8,
                           num_encoder_layers=1, num_decoder_layers=1, mlp_dim=32,
                           dropout_rate=0.0, prior="fan_in", prior_stddev=0.5)
UNITS = 1000.0  # the KL's D: large enough a KL term, small enough a visible one
KL = 0.1  # bayesian.gin's
OPTIMIZER = Optimizer(learning_rate=LearningRate("constant", 1e-2, warmup_steps=0),
                      weight_decay=0.1)
STEPS = 3
SIGNED_ZERO = ("encoder", "layers", "mlp", "wi_0", "kernel_scale")  # one entry set to -0.0


def batch():
  rng = np.random.default_rng(0)
  mask = np.arange(8) < np.array([3, 8, 5, 8])[:, None]
  targets = np.where(mask, rng.integers(2, 32, mask.shape), 0).astype(np.int32)
  return {"encoder_input_tokens": jnp.asarray(rng.integers(2, 32, mask.shape, np.int32)),
          "decoder_input_tokens": jnp.asarray(np.pad(targets[:, :-1], ((0, 0), (1, 0)))),
          "decoder_target_tokens": jnp.asarray(targets),
          "decoder_loss_weights": jnp.asarray(mask, jnp.float32)}


def model():
  return EncoderDecoderModel(CONFIG, num_train_units=UNITS)


@functools.cache
def fresh_params():
  shapes = {k: v.shape for k, v in batch().items()}
  return jax.jit(lambda k: nn.unbox(init_train_state(model(), optax.sgd(1.0), shapes, k)))(
      jax.random.key(0)).params


def flat(tree):
  return traverse_util.flatten_dict(dict(tree))


def is_scale(path):
  return frozen_stddevs.is_posterior_scale(path[-1])


def learned_scales(params, shift=1.0, seed=1):
  """"Another run's" scales: the initial ones moved by up to ``shift``, one entry -0.0."""
  scales = {}
  for index, (path, value) in enumerate(sorted(flat(params).items())):
    if is_scale(path):
      noise = jax.random.uniform(jax.random.key(seed + index), value.shape, value.dtype)
      scales[path] = value + shift * noise
  scales[SIGNED_ZERO] = scales[SIGNED_ZERO].at[(0, 0, 0)].set(-0.0)
  return scales


def with_scales(params, scales):
  return traverse_util.unflatten_dict(flat(params) | scales)


def trained(params, kl_weight):
  """``STEPS`` steps of the trainer's step with the scales frozen: (params, opt_state)."""
  steps = frozen_stddevs.freeze(StepFunctions.build(model(), OPTIMIZER, KLWeight(value=kl_weight)))
  state = TrainState(step=jnp.zeros((), jnp.int32), params=params,
                     opt_state=steps.optimizer.init(params))
  step = jax.jit(steps.train_step)
  for _ in range(STEPS):
    state, metrics = step(state, batch())
  return state, metrics


def by_hand(params, kl_weight):
  """``STEPS`` steps of the recipe's optimizer on every parameter but the scales, the scales
  constants of the loss: the rest as a run whose scales are not parameters trains it."""
  scales = {k: v for k, v in flat(params).items() if is_scale(k)}
  rest = traverse_util.unflatten_dict({k: v for k, v in flat(params).items() if not is_scale(k)})
  inner = OPTIMIZER.transformation()

  @jax.jit
  def step(rest, opt_state, index):
    loss = lambda r: model().loss_fn(with_scales(r, scales), batch(),
                                     jax.random.fold_in(jax.random.key(0), index), kl_weight)
    grads = jax.grad(loss, has_aux=True)(rest)[0]
    updates, opt_state = inner.update(grads, opt_state, rest)
    return optax.apply_updates(rest, updates), opt_state, optax.tree.norm(grads)

  opt_state, norms = inner.init(rest), []
  for index in range(STEPS):
    rest, opt_state, norm = step(rest, opt_state, index)
    norms.append(float(norm))
  return rest, norms


def bits(x):
  return np.asarray(x).view(np.uint32)


def test_frozen_scales_keep_their_bits_and_the_rest_trains_as_with_constant_scales():
  """noise_map's step (noise's differs in the KL weight alone)."""
  start = with_scales(fresh_params(), learned_scales(fresh_params()))
  state, metrics = trained(start, KL)
  reference, norms = by_hand(start, KL)
  after, before = flat(state.params), flat(start)
  scales = [k for k in after if is_scale(k)]
  assert len(scales) == 18 and min(norms) > 1.0  # every step clipped: the norm matters
  for path in scales:  # bitwise, -0.0 included: no step, no decay
    np.testing.assert_array_equal(bits(after[path]), bits(before[path]), err_msg=str(path))
  assert np.signbit(after[SIGNED_ZERO][0, 0, 0])
  adam = state.opt_state[1][0]  # clipping, then AdamW: the recipe's state, at its paths
  for moment in (adam.mu, adam.nu):
    assert all(not np.any(v) for k, v in flat(moment).items() if is_scale(k))
  for path, value in flat(reference).items():  # the means, norms, embeddings: as by hand
    assert not np.array_equal(after[path], before[path]), path
    np.testing.assert_allclose(after[path], value, rtol=2e-5, atol=2e-7, err_msg=str(path))
  assert float(metrics["kl_term"]) == pytest.approx(KL * float(metrics["kl"]) / UNITS)


def test_with_frozen_scales_the_kl_on_the_means_is_maps_l2():
  """noise_map's KL term against noise's: on each mean ``w``, KL weight x ``w`` / prior
  variance / D, the prior variance ``0.5^2 / fan_in``; nothing on any other parameter,
  whatever the frozen stddevs."""
  params = fresh_params()
  penalty = jax.jit(jax.grad(lambda p: model().loss_fn(p, batch(), jax.random.key(3), KL)[0]
                             - model().loss_fn(p, batch(), jax.random.key(3), 0.0)[0]))
  fan_in = {"wi_0": 16, "wi_1": 16, "wo": 32, "query": 16, "key": 16, "value": 16, "out": 16}
  grads = [flat(penalty(with_scales(params, learned_scales(params, shift, seed))))
           for shift, seed in ((1.0, 1), (-2.0, 7))]
  means = 0
  for path, value in flat(params).items():
    if is_scale(path):
      continue
    if path[-1] != "kernel_loc":  # 0 but for the rounding of the two losses' difference
      assert max(np.max(np.abs(grad[path])) for grad in grads) < 1e-7, path
      continue
    means += 1
    l2 = KL * np.asarray(value) * fan_in[path[-2]] / 0.5**2 / UNITS
    for grad in grads:
      np.testing.assert_allclose(grad[path], l2, rtol=2e-3, atol=1e-9, err_msg=str(path))
  assert means == 18


def trained_config(gin_file, *bindings):
  """The config.gin a run of ``gin_file`` (under gin_configs/) records, with ``bindings``
  (tests/experiments/recipe_configs.py's, and a source run)."""
  import gin

  from meshbayes import configurables  # noqa: F401  (registers the configurables)
  from meshbayes.gin_configs import DIRECTORY as GIN_CONFIGS

  gin.clear_config()
  gin.add_config_file_search_path(str(GIN_CONFIGS))
  try:
    gin.parse_config_files_and_bindings([str(GIN_CONFIGS / gin_file)],
                                        ["MODEL_DIR = 'x'", "TRAIN_STEPS = 1", *bindings],
                                        skip_unknown=True)
    return gin.config_str()
  finally:
    gin.clear_config()


def test_the_recipes_are_the_bayesian_layers_with_the_stddevs_frozen():
  source = ["FROZEN_STDDEVS_FROM = 'runs/bayesian_seed200'"]
  bound = lambda recipe, extra=(): set(trained_config(f"uncertainty/{recipe}.gin",
                                                      *extra).splitlines())
  frozen = {"CheckpointConfig.frozen_stddevs_from = %FROZEN_STDDEVS_FROM", *source}
  assert bound("noise_map", source) - bound("bayesian") == frozen
  assert bound("noise", source) - bound("bayesian") == frozen | {"KLWeight.value = 0.0"}
  with pytest.raises(ValueError, match="FROZEN_STDDEVS_FROM/macro.value set to `%gin.REQUIRED`"):
    trained_config("uncertainty/noise.gin")


def _make_run(run_dir, curve=(), steps=()):
  for step in steps:
    (run_dir / "checkpoints" / str(step)).mkdir(parents=True)
  (run_dir / "eval").mkdir(parents=True, exist_ok=True)
  (run_dir / "eval" / "metrics.jsonl").write_text(
      "".join(strict_json.dumps({"step": s, "nll": nll}) + "\n" for s, nll in curve))
  return run_dir


def test_the_source_is_the_best_kept_checkpoint_or_one_clear_line(tmp_path):
  run = _make_run(tmp_path / "src", [(2, 3.0), (4, 2.5), (6, 2.5), (8, 2.7)], (2, 4, 6, 8))
  assert frozen_stddevs.source(run) == frozen_stddevs.Source(str(run), 4, "best validation NLL")
  assert frozen_stddevs.source(run, 8) == frozen_stddevs.Source(str(run), 8, "given")
  expected = ("expected the run directory of a run with Bayesian layers of this model's shape "
              "(the KL-0.1 run of the same seed)")
  cases = [
      (tmp_path / "none", None, f"train: run_configs.CheckpointConfig.frozen_stddevs_from="
       f"'{tmp_path / 'none'}' holds no checkpoints/ (no such run, or not trained yet); "
       f"{expected}"),
      (_make_run(tmp_path / "no_eval", steps=(2,)), None,
       f"train: run_configs.CheckpointConfig.frozen_stddevs_from='{tmp_path / 'no_eval'}' has "
       "no validation NLL (eval/metrics.jsonl) to take its best checkpoint from; give the step: "
       "run_configs.CheckpointConfig.frozen_stddevs_step (kept: [2])"),
      (_make_run(tmp_path / "pruned", [(2, 1.0), (4, 2.0)], (4,)), None,
       f"train: run_configs.CheckpointConfig.frozen_stddevs_from='{tmp_path / 'pruned'}': its "
       f"best checkpoint by validation NLL, step 2, is not kept (kept: [4]); {expected}, its "
       "checkpoints kept (run_configs.CheckpointConfig.keep=None)"),
      (run, 5, f"train: run_configs.CheckpointConfig.frozen_stddevs_from='{run}': the "
       f"checkpoint, step 5, is not kept (kept: [2, 4, 6, 8]); {expected}, its checkpoints "
       "kept (run_configs.CheckpointConfig.keep=None)")]
  for path, step, message in cases:
    with pytest.raises(ValueError) as error:
      frozen_stddevs.source(path, step)
    assert str(error.value) == message
  with pytest.raises(ValueError, match=r"^CheckpointConfig: frozen_stddevs_step=4 needs "
                                       r"frozen_stddevs_from \(the run to take the stddevs "
                                       r"from\)$"):
    CheckpointConfig(frozen_stddevs_step=4)
  with pytest.raises(ValueError, match=r"^CheckpointConfig: frozen_stddevs_from='' must be a "):
    CheckpointConfig(frozen_stddevs_from="")


def _saved_run(run_dir, params, step=3):
  """A run directory with one checkpoint of ``params`` (as the trainer saves a state)."""
  ckpts = checkpoints_lib.Checkpoints(run_dir / "checkpoints", None, False)
  ckpts.save(step, TrainState(step=jnp.asarray(step), params=params, opt_state={}), {})
  ckpts.wait()
  ckpts.close()
  return frozen_stddevs.Source(str(run_dir), step, "given")


def _target(params):
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), params)


def test_load_takes_the_scales_alone_and_refuses_another_model_in_one_line(tmp_path):
  ours = {"dense": {"kernel_loc": jnp.ones((2, 3)), "kernel_scale": jnp.full((2, 3), -5.0)},
          "norm": {"scale": jnp.ones(3)}}
  theirs = {"dense": {"kernel_loc": jnp.full((2, 3), 7.0),
                      "kernel_scale": jnp.arange(6.0).reshape(2, 3) - 3.0},
            "norm": {"scale": jnp.full(3, 9.0)}}
  source = _saved_run(tmp_path / "bayesian", theirs)
  params, record = frozen_stddevs.load(source, ours, _target(ours))
  np.testing.assert_array_equal(params["dense"]["kernel_scale"], theirs["dense"]["kernel_scale"])
  np.testing.assert_array_equal(params["dense"]["kernel_loc"], 1.0)
  np.testing.assert_array_equal(params["norm"]["scale"], 1.0)  # a norm's scale is not frozen
  assert {k: v for k, v in record.items() if k != "scales_checksum"} == {
      "run": str(tmp_path / "bayesian"), "step": 3, "chosen_by": "given", "scales": 1}
  other = dict(theirs, dense={"kernel_loc": theirs["dense"]["kernel_loc"],
                              "kernel_scale": theirs["dense"]["kernel_scale"] + 1})
  assert frozen_stddevs.load(_saved_run(tmp_path / "other", other), ours,
                             _target(ours))[1]["scales_checksum"] != record["scales_checksum"]

  expected = ("expected the run directory of a run with Bayesian layers of this model's shape "
              "(the KL-0.1 run of the same seed)")
  point = _saved_run(tmp_path / "point", {"dense": {"kernel": jnp.ones((2, 3))}})
  wide = _saved_run(tmp_path / "wide", {"dense": {"kernel_loc": jnp.ones((2, 4)),
                                                  "kernel_scale": jnp.ones((2, 4))},
                                        "out": {"bias_scale": jnp.ones(4)}})
  for run, problem in (
      (point, "holds no posterior scales (a deterministic or IVON run)"),
      (wide, "is of another model: params/dense/kernel_scale has shape (2, 4), this model's is "
             "(2, 3) (and 1 more)")):
    with pytest.raises(ValueError) as error:
      frozen_stddevs.load(run, ours, _target(ours))
    assert str(error.value) == (f"train: run_configs.CheckpointConfig.frozen_stddevs_from="
                                f"'{run.run}' (step 3) {problem}; {expected}")


def test_a_resumed_run_must_name_the_source_its_checkpoint_records(tmp_path):
  meta = {frozen_stddevs.META_KEY: {"run": str(tmp_path / "src"), "step": 4}}
  check = lambda meta, run, step=None: frozen_stddevs.check_resume(meta, "CKPT", run, step)
  check({}, None)
  check(meta, str(tmp_path / "src"))
  check(meta, str(tmp_path / "src"), 4)
  binding = "run_configs.CheckpointConfig.frozen_stddevs_from"
  for args, message in (
      (({}, "src"), f"train: {binding}='src' but the checkpoint CKPT trained its posterior "
                    "stddevs; unset it to resume, or start a new MODEL_DIR"),
      ((meta, None), f"train: the checkpoint CKPT has its posterior stddevs frozen at "
                     f"'{tmp_path / 'src'}' (step 4); resume with {binding}="
                     f"'{tmp_path / 'src'}', or start a new MODEL_DIR"),
      ((meta, str(tmp_path / "src"), 6),
       f"train: {binding}='{tmp_path / 'src'}' (step 6) but the checkpoint CKPT has its "
       f"posterior stddevs frozen at '{tmp_path / 'src'}' (step 4); resume with that source, "
       "or start a new MODEL_DIR")):
    with pytest.raises(ValueError) as error:
      check(*args)
    assert str(error.value) == message


# Tiny runs through the commands: a Bayesian source, then each control from it.

def _scales_of(step_dir):
  return {k: v for k, v in checkpoints_lib.read_arrays(step_dir).items()
          if k.startswith("params/") and frozen_stddevs.is_posterior_scale(k.rsplit("/", 1)[-1])}


@pytest.fixture(scope="module")
def source_run(tmp_path_factory):
  """A tiny Bayesian run, validated and saved at every step: its best step is the lower of
  two validation NLLs."""
  run_dir = tmp_path_factory.mktemp("frozen") / "bayesian"
  train_or_fail(train_args(run_dir, 2, "--gin.run_configs.CheckpointConfig.period=1",
                           "--gin.run_configs.EvaluationConfig.period=1"))
  return run_dir


def _control(source_run, name, kl_weight):
  run_dir = source_run.parent / name
  train_or_fail(train_args(run_dir, 2, f"--gin.optimizers.KLWeight.value={kl_weight}",
                           f"--gin.run_configs.CheckpointConfig.frozen_stddevs_from="
                           f"'{source_run}'"))
  return run_dir


@pytest.fixture(scope="module")
def noise_run(source_run):
  return _control(source_run, "noise", 0.0)


@pytest.fixture(scope="module")
def noise_map_run(source_run):
  return _control(source_run, "noise_map", KL)


@pytest.mark.integration
def test_a_control_run_holds_the_sources_best_stddevs_and_records_them(source_run, noise_run):
  curve = [json.loads(line) for line in (source_run / "eval" / "metrics.jsonl").open()]
  best = min(curve, key=lambda r: (r["nll"], r["step"]))["step"]
  frozen = _scales_of(noise_run / "checkpoints" / "2")
  source = _scales_of(source_run / "checkpoints" / str(best))
  assert len(frozen) == 18 and frozen.keys() == source.keys()
  for path, value in frozen.items():
    np.testing.assert_array_equal(bits(value), bits(source[path]), err_msg=path)
  record = checkpoints_lib.read_meta(noise_run / "checkpoints" / "2")[frozen_stddevs.META_KEY]
  assert {k: record[k] for k in ("run", "step", "chosen_by", "scales")} == {
      "run": str(source_run), "step": best, "chosen_by": "best validation NLL", "scales": 18}
  assert strict_json.loads_strict((noise_run / "frozen_stddevs.json").read_text()) == record
  bound = gin_preflight.bound_values((noise_run / "config.gin").read_text())
  assert bound[("CheckpointConfig", "frozen_stddevs_from")] == str(source_run)


@pytest.mark.integration
def test_noise_trains_without_the_kl_term_and_noise_map_with_it(noise_run, noise_map_run):
  """The KL is computed in both (the stddevs' KL from the prior), weighed 0 and 0.1."""
  for run_dir, weight in ((noise_run, 0.0), (noise_map_run, KL)):
    logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    assert [r["step"] for r in logged] == [2]  # the first step's compilation is not logged
    for record in logged:
      assert record["kl"] > 0 and record["kl_weight"] == pytest.approx(weight)
      assert record["kl_term"] == pytest.approx(weight * record["kl"] / 450000, rel=1e-5)
    assert (run_dir / "config.gin").read_text().count(f"KLWeight.value = {weight}") == 1


@pytest.mark.integration
def _error(err):
  """``one_line(err)`` without the traceback's file."""
  return re.sub(r" \(traceback in \S+\)$", "", one_line(err))


def test_a_bad_source_or_another_one_on_resume_is_one_line(source_run, noise_run, capsys):
  best = checkpoints_lib.read_meta(noise_run / "checkpoints" / "2")[
      frozen_stddevs.META_KEY]["step"]
  code, _, err = train(capsys, *train_args(
      source_run.parent / "bad", 2, f"--gin.run_configs.CheckpointConfig.frozen_stddevs_from="
      f"'{source_run.parent / 'missing'}'"))
  assert code == 1 and _error(err) == (
      "meshbayes.train: error: train: run_configs.CheckpointConfig.frozen_stddevs_from="
      f"'{source_run.parent / 'missing'}' holds no checkpoints/ (no such run, or not trained "
      "yet); expected the run directory of a run with Bayesian layers of this model's shape "
      "(the KL-0.1 run of the same seed)")
  code, _, err = train(capsys, *train_args(
      noise_run, 4, "--gin.optimizers.KLWeight.value=0.0",
      f"--gin.run_configs.CheckpointConfig.frozen_stddevs_from='{source_run}'",
      f"--gin.run_configs.CheckpointConfig.frozen_stddevs_step={3 - best}"))
  assert code == 1 and _error(err) == (
      "meshbayes.train: error: train: run_configs.CheckpointConfig.frozen_stddevs_from="
      f"'{source_run}' (step {3 - best}) but the checkpoint {noise_run / 'checkpoints' / '2'} "
      f"has its posterior stddevs frozen at '{source_run}' (step {best}); resume with that "
      "source, or start a new MODEL_DIR")


@pytest.mark.integration
@pytest.mark.parametrize("method", ["noise", "noise_map"])
def test_each_control_is_evaluated_as_its_own_method(method, noise_run, noise_map_run, capsys):
  run_dir = {"noise": noise_run, "noise_map": noise_map_run}[method]
  assert predictive_methods.get(method).trained_by == method
  code, _, err = command(capsys, "evaluate", *eval_args(
      run_dir, "--gin.evaluation.PredictiveConfig.num_samples=2",
      "--gin.evaluation.ReportConfig.bootstrap_resamples=10"), model_from_model_dir=True)
  assert code == 0, err[-2000:]
  written = strict_json.loads_strict(
      (run_dir / "eval" / "synthetic_reverse" / "metrics.json").read_text())
  assert (written["step"], written["method"]) == (2, method)  # told by its config.gin
  assert written["predictives"] == ["model_average", "posterior_mean"]
  other = {"noise": "noise_map", "noise_map": "noise"}[method]
  code, _, err = command(capsys, "evaluate", *eval_args(
      run_dir, f"--gin.evaluation.PredictiveConfig.method='{other}'"), model_from_model_dir=True)
  assert code == 1 and f"evaluate: method='{other}' predicts with Bayesian-layers runs" in err
