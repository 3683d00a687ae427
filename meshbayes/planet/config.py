"""The settings of one PlaNet agent, checked when built, and the presets that size it.

``PRESETS['toy']`` is the tests' agent (seconds); ``PRESETS['cpu']`` is ``make planet``'s,
sized so both agents with 3 seeds each fit an hour on 2 CPU cores (docs/planet.md).
"""

from __future__ import annotations

import dataclasses

from meshbayes.field_checks import positive_ints, positive_numbers
from meshbayes.layers import ESTIMATORS


@dataclasses.dataclass(frozen=True)
class PlanetConfig:
  """One agent: environment, world model, planner, data collection and training.

  Attributes:
    estimator: the transition's Dense layers: ``'deterministic'`` (PlaNet) or a Bayesian
      estimator name (``'reparameterization'``: Bayesian PlaNet).
    image_size: observation width and height in pixels (a power of 2, at least 8).
    episode_steps: environment steps per episode (gym's 200).
    action_repeat: environment steps per agent decision; divides ``episode_steps``.
    seed_episodes: episodes of uniformly random actions before training.
    train_episodes: episodes collected by the planner, each after a training round.
    train_steps: gradient steps per training round.
    batch_size: sequences per gradient step.
    chunk_length: decisions per training sequence.
    deter_size: the GRU's (deterministic) state size.
    stoch_size: the Gaussian (stochastic) state size.
    hidden_size: width of the transition's, posterior's and reward model's hidden layers.
    conv_depth: channels of the encoder's first convolution (doubling per layer).
    min_std: lower bound of the latent state's standard deviation.
    free_nats: the latent KL term is ``max(free_nats, mean KL)``.
    weight_kl_weight: the weights' KL enters as ``weight_kl_weight * KL / transitions``.
    learning_rate: Adam's step size.
    grad_clip: global gradient-norm clip.
    horizon: planning horizon in decisions.
    cem_iterations: CEM refits per decision.
    cem_candidates: action sequences scored per CEM iteration.
    cem_top_k: the elite refitted from.
    exploration_noise: stddev of the Gaussian noise added to collected actions.
    eval_episodes: held-out episodes (no noise) for the return, open-loop error and probe.
    open_loop_context: decisions observed before the open-loop prediction.
    open_loop_steps: decisions predicted open loop.
    seed: seeds the environment, initialization and sampling.
  """

  estimator: str = "deterministic"
  image_size: int = 32
  episode_steps: int = 200
  action_repeat: int = 2
  seed_episodes: int = 3
  train_episodes: int = 40
  train_steps: int = 40
  batch_size: int = 16
  chunk_length: int = 24
  deter_size: int = 64
  stoch_size: int = 8
  hidden_size: int = 64
  conv_depth: int = 8
  min_std: float = 0.1
  free_nats: float = 1.0
  weight_kl_weight: float = 1.0
  learning_rate: float = 1e-3
  grad_clip: float = 100.0
  horizon: int = 12
  cem_iterations: int = 6
  cem_candidates: int = 250
  cem_top_k: int = 25
  exploration_noise: float = 0.3
  eval_episodes: int = 3
  open_loop_context: int = 5
  open_loop_steps: int = 50
  seed: int = 0

  def __post_init__(self):
    if self.estimator not in ESTIMATORS:
      raise ValueError(f"PlanetConfig: estimator={self.estimator!r} is not one of {ESTIMATORS}")
    size = self.image_size
    if size < 8 or size & (size - 1):
      raise ValueError(f"PlanetConfig: image_size={size} must be a power of 2, at least 8")
    positive_ints("PlanetConfig", self, "episode_steps", "action_repeat", "train_steps",
                  "batch_size", "chunk_length", "deter_size", "stoch_size", "hidden_size",
                  "conv_depth", "horizon", "cem_iterations", "cem_candidates", "cem_top_k",
                  "eval_episodes", "open_loop_context", "open_loop_steps", "seed_episodes")
    positive_ints("PlanetConfig", self, "train_episodes", "seed", allow_zero=True)
    positive_numbers("PlanetConfig", self, "free_nats", "weight_kl_weight", "exploration_noise",
                     allow_zero=True)
    positive_numbers("PlanetConfig", self, "min_std", "learning_rate", "grad_clip")
    if self.episode_steps % self.action_repeat:
      raise ValueError(f"PlanetConfig: action_repeat={self.action_repeat} must divide "
                       f"episode_steps={self.episode_steps}")
    if self.chunk_length > self.decisions:
      raise ValueError(f"PlanetConfig: chunk_length={self.chunk_length} exceeds the "
                       f"{self.decisions} decisions of an episode")
    if self.open_loop_context + self.open_loop_steps > self.decisions:
      raise ValueError(f"PlanetConfig: open_loop_context + open_loop_steps = "
                       f"{self.open_loop_context + self.open_loop_steps} exceeds the "
                       f"{self.decisions} decisions of an episode")
    if self.cem_top_k > self.cem_candidates:
      raise ValueError(f"PlanetConfig: cem_top_k={self.cem_top_k} exceeds "
                       f"cem_candidates={self.cem_candidates}")

  @property
  def decisions(self) -> int:
    """Agent decisions per episode."""
    return self.episode_steps // self.action_repeat

  @property
  def bayesian(self) -> bool:
    """Whether the transition's Dense layers have weight posteriors."""
    return self.estimator != "deterministic"


PRESETS = {
    "toy": PlanetConfig(image_size=16, episode_steps=40, action_repeat=2, seed_episodes=1,
                        train_episodes=1, train_steps=3, batch_size=4, chunk_length=8,
                        deter_size=16, stoch_size=4, hidden_size=16, conv_depth=4, horizon=3,
                        cem_iterations=2, cem_candidates=16, cem_top_k=4, eval_episodes=1,
                        open_loop_context=2, open_loop_steps=10, learning_rate=3e-3),
    "cpu": PlanetConfig(),
}
