"""A run's posterior is restored through the registry of run posteriors: checkpoint_restore
names no kind, an IVON checkpoint restores as its WeightPosterior, a kind registered
elsewhere restores as its own."""

import re
from pathlib import Path

import jax
import numpy as np
import pytest

from meshbayes.layers import WeightPosterior
from meshbayes.training import checkpoint_restore, checkpoints, ivon, run_posteriors
from tests.training import restore_fakes

PARAMS = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.full(3, 0.5, np.float32)}
HESSIAN = {"w": np.linspace(0.0, 2.0, 6, dtype=np.float32).reshape(2, 3),
           "b": np.array([1e-3, 0.1, 7.0], np.float32)}
IVON_RECORD = {"ess": 1000.0, "weight_decay": 1e-4}


def _saved(directory, state, meta):
  ckpts = checkpoints.Checkpoints(directory / "checkpoints")
  ckpts.save(3, state, meta)
  ckpts.close()


def _restored(directory):
  return restore_fakes.restore(directory, PARAMS)


def test_checkpoint_restore_names_no_posterior_kind():
  source = Path(checkpoint_restore.__file__).read_text()
  kinds = re.compile(r"ivon|weight_?posterior|mc_?dropout|ensemble|laplace|hessian|opt_state|"
                     r"stddev", re.IGNORECASE)
  assert [(number, line) for number, line in enumerate(source.splitlines(), 1)
          if kinds.search(line)] == []


def test_an_ivon_checkpoint_restores_as_the_weight_posterior_of_its_hessian(tmp_path):
  _saved(tmp_path, {"params": PARAMS, "opt_state": {"hessian": HESSIAN}},
         {ivon.IVON_META: IVON_RECORD})
  posterior, step = _restored(tmp_path)
  assert step == 3 and isinstance(posterior, WeightPosterior)
  for name in PARAMS:
    np.testing.assert_array_equal(posterior.mean[name], PARAMS[name])
    # The computation the restore always made (jit, rsqrt in float32), bit for bit.
    expected = jax.jit(lambda h: jax.lax.rsqrt(1000.0 * (h + 1e-4)))(HESSIAN[name])
    np.testing.assert_array_equal(posterior.stddev[name], expected)
  np.testing.assert_allclose(posterior.stddev["b"],
                             1 / np.sqrt(1000.0 * (HESSIAN["b"] + 1e-4)), rtol=1e-6)


def test_a_checkpoint_without_a_record_restores_as_its_parameters(tmp_path):
  _saved(tmp_path, {"params": PARAMS, "opt_state": {"hessian": HESSIAN}}, {"task": "t"})
  params, _ = _restored(tmp_path)
  assert set(params) == {"w", "b"}
  np.testing.assert_array_equal(params["w"], PARAMS["w"])


@pytest.fixture
def registry(monkeypatch):
  """The run posteriors' registry as it was, after the test."""
  monkeypatch.setattr(run_posteriors, "_RUN_POSTERIORS",
                      dict(run_posteriors._RUN_POSTERIORS))  # pylint: disable=protected-access
  return run_posteriors


def test_a_kind_registered_elsewhere_is_restored_by_its_own_entry(tmp_path, registry):
  """A toy kind kept beside the parameters (a stddev of its own, scaled by its record):
  checkpoint_restore restores its subtree and builds it, knowing nothing of it."""
  registry.register(registry.RunPosterior(
      "toy", "toy", "toy_posterior",
      state=lambda params, record: {"toy_state": {"spread": params}},
      build=lambda restored, record: WeightPosterior(
          restored["params"], jax.tree.map(lambda s: s * record["factor"],
                                           restored["toy_state"]["spread"]))))
  assert registry.names() == ("parameters", "ivon", "toy")
  _saved(tmp_path, {"params": PARAMS, "toy_state": {"spread": HESSIAN}},
         {"toy_posterior": {"factor": 2.0}})
  posterior, _ = _restored(tmp_path)
  np.testing.assert_array_equal(posterior.stddev["w"], HESSIAN["w"] * 2.0)
  np.testing.assert_array_equal(posterior.mean["b"], PARAMS["b"])
  with pytest.raises(ValueError, match=r"^the checkpoint records 2 posteriors \(ivon, toy\); a "
                                       r"run holds at most one$"):
    registry.held_by({ivon.IVON_META: IVON_RECORD, "toy_posterior": {"factor": 1.0}})


def test_a_kind_needs_a_record_of_its_own(registry):
  build = lambda restored, record: restored["params"]
  with pytest.raises(ValueError, match=r"^register: run posterior 'swag' \(meta key 'ivon'\) "
                                       r"clashes with the registered 'ivon'$"):
    registry.register(registry.RunPosterior("swag", "SWAG", "ivon", lambda p, r: {}, build))
  with pytest.raises(ValueError, match=r"^register: run posterior 'swag' needs a meta_key"):
    registry.register(registry.RunPosterior("swag", "SWAG", None, lambda p, r: {}, build))
  assert registry.names() == ("parameters", "ivon")
  assert registry.held_by({"ivon": {}}) is registry.PARAMETERS  # an empty record is none
