"""The settings of one PlaNet agent, checked when built, and the presets that size it.

``PRESETS['toy']`` is the tests' agent (seconds); ``PRESETS['cpu']`` is ``make planet``'s
(docs/planet.md: its cost per seed and agent).
"""

from __future__ import annotations

import dataclasses

from meshbayes.field_checks import positive_ints, positive_numbers
from meshbayes.layers import ESTIMATORS

DECISION_RULES = ("mean", "thompson", "average", "per_decision")
"""How a Bayesian agent acts on its weight posterior (the deterministic agent has one way):
``mean`` plans and filters with the posterior-mean weights; ``thompson`` draws one weight
sample per episode and acts on it throughout (Thompson sampling); ``average`` scores each
CEM candidate by its predicted return averaged over ``plan_samples`` weight samples drawn
per decision, filtering with the mean; ``per_decision`` draws a new sample at every
decision, for filtering and planning (the agent before 2026-11-28 drew one for each)."""
TRANSITION_PRIORS = ("standard_normal", "fan_in_scaled")
# The fields only a Bayesian agent reads (its weight posterior and how it collects data):
# PlaNet's run is the same whatever they are, so its config keeps their defaults.
POSTERIOR_FIELDS = ("transition_prior", "transition_stddev_ratio", "weight_kl_weight",
                    "weight_kl_warmup_rounds", "collect_rule")


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
    free_nats: each (sequence, decision)'s latent KL enters as ``max(free_nats, KL)``.
    reward_scale: the reward's Gaussian NLL enters the loss times this; rewards are in
      units of ``pendulum.REWARD_UNIT`` (at most 1 per step, as in PlaNet's tasks), so 10 is
      PlaNet's weight.
    weight_kl_weight: the weights' KL enters as ``weight_kl_weight * KL / transitions``.
    weight_kl_warmup_rounds: the KL's weight rises linearly over this many training
      rounds, ``min(1, round / weight_kl_warmup_rounds)`` times ``weight_kl_weight`` in
      round ``1, 2, ...`` (0: the full weight from the first round).
    transition_prior: the Bayesian transition's weight prior: N(0, 1)
      (``standard_normal``) or N(0, 1 / fan_in) (``fan_in_scaled``, chosen on the pilot's
      validation returns: docs/planet.md).
    transition_stddev_ratio: the transition posterior's initial stddev, as a fraction of
      ``1 / sqrt(fan_in)``.
    learning_rate: Adam's step size.
    grad_clip: global gradient-norm clip.
    horizon: planning horizon in decisions.
    cem_iterations: CEM refits per decision.
    cem_candidates: action sequences scored per CEM iteration.
    cem_top_k: the elite refitted from.
    exploration_noise: stddev of the Gaussian noise added to collected actions.
    collect_rule: the decision rule (``DECISION_RULES``) of a Bayesian agent collecting
      training episodes.
    plan_samples: weight samples per decision of the ``average`` rule.
    validation_episodes: episodes per decision rule from validation start states (no
      noise), on which the rule is chosen.
    eval_episodes: held-out episodes per decision rule (no noise) for the return.
    probe_episodes: episodes of random actions, the same for every agent of a seed: the
      first half fits the velocity probe, the rest scores it and the open-loop error.
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
  reward_scale: float = 10.0
  weight_kl_weight: float = 1.0
  weight_kl_warmup_rounds: int = 0
  transition_prior: str = "fan_in_scaled"
  transition_stddev_ratio: float = 0.1
  learning_rate: float = 1e-3
  grad_clip: float = 100.0
  horizon: int = 12
  cem_iterations: int = 6
  cem_candidates: int = 250
  cem_top_k: int = 25
  exploration_noise: float = 0.3
  collect_rule: str = "thompson"
  plan_samples: int = 4
  validation_episodes: int = 3
  eval_episodes: int = 10
  probe_episodes: int = 12
  open_loop_context: int = 5
  open_loop_steps: int = 50
  seed: int = 0

  def __post_init__(self):
    for name, valid in (("estimator", ESTIMATORS), ("collect_rule", DECISION_RULES),
                        ("transition_prior", TRANSITION_PRIORS)):
      if getattr(self, name) not in valid:
        raise ValueError(f"PlanetConfig: {name}={getattr(self, name)!r} is not one of "
                         f"{', '.join(valid)}")
    size = self.image_size
    if size < 8 or size & (size - 1):
      raise ValueError(f"PlanetConfig: image_size={size} must be a power of 2, at least 8")
    positive_ints("PlanetConfig", self, "episode_steps", "action_repeat", "train_steps",
                  "batch_size", "chunk_length", "deter_size", "stoch_size", "hidden_size",
                  "conv_depth", "horizon", "cem_iterations", "cem_candidates", "cem_top_k",
                  "eval_episodes", "open_loop_context", "open_loop_steps", "seed_episodes",
                  "plan_samples", "validation_episodes", "probe_episodes")
    positive_ints("PlanetConfig", self, "train_episodes", "seed", "weight_kl_warmup_rounds",
                  allow_zero=True)
    positive_numbers("PlanetConfig", self, "free_nats", "weight_kl_weight", "exploration_noise",
                     "reward_scale", allow_zero=True)
    positive_numbers("PlanetConfig", self, "min_std", "learning_rate", "grad_clip",
                     "transition_stddev_ratio")
    if self.probe_episodes % 2:
      raise ValueError(f"PlanetConfig: probe_episodes={self.probe_episodes!r} must be even "
                       "(half fit the probe, half score it)")
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

  def weight_kl_factor(self, round_index: int) -> float:
    """The KL weight's warm-up factor in training round ``round_index`` (0-based).

    >>> PlanetConfig(weight_kl_warmup_rounds=4).weight_kl_factor(1)
    0.5
    """
    if not self.weight_kl_warmup_rounds:
      return 1.0
    return min(1.0, (round_index + 1) / self.weight_kl_warmup_rounds)

  def canonical(self) -> PlanetConfig:
    """This agent's config as its runs are kept: a deterministic agent's with
    ``POSTERIOR_FIELDS`` at their defaults (it reads none of them), a Bayesian one as it is.

    >>> PlanetConfig(estimator="deterministic", transition_stddev_ratio=0.01).canonical(
    ...     ).transition_stddev_ratio
    0.1
    """
    if self.bayesian:
      return self
    return dataclasses.replace(self, **{f.name: f.default for f in dataclasses.fields(self)
                                        if f.name in POSTERIOR_FIELDS})

  @property
  def bayesian(self) -> bool:
    """Whether the transition's Dense layers have weight posteriors."""
    return self.estimator != "deterministic"

  @property
  def decision_rules(self) -> tuple[str, ...]:
    """The rules this agent is evaluated with: all for a Bayesian one, ``mean`` (the only
    one there is) for the deterministic one."""
    return DECISION_RULES if self.bayesian else ("mean",)


PRESETS = {
    "toy": PlanetConfig(image_size=16, episode_steps=40, action_repeat=2, seed_episodes=1,
                        train_episodes=1, train_steps=3, batch_size=4, chunk_length=8,
                        deter_size=16, stoch_size=4, hidden_size=16, conv_depth=4, horizon=3,
                        cem_iterations=2, cem_candidates=16, cem_top_k=4, eval_episodes=1,
                        validation_episodes=1, probe_episodes=2, plan_samples=2,
                        open_loop_context=2, open_loop_steps=10, learning_rate=3e-3),
    # The initial stddev ratio is the ablation's remedy, chosen on the pilot seeds
    # (docs/results/2026-11-29-planet-ablation.md); 0.1 until 2026-11-29.
    "cpu": PlanetConfig(transition_stddev_ratio=0.01),
}
