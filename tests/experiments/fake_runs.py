"""What the experiment tests' fake runners write for a command instead of running it."""

import json
from pathlib import Path


def gin_bindings(args: list[str]) -> dict[str, str]:
  """The ``--gin.NAME=VALUE`` bindings of a command's arguments."""
  return dict(a[len("--gin."):].split("=", 1) for a in args if a.startswith("--gin."))


def write_trained_run(bound: dict[str, str]) -> None:
  """A finished run where ``MODEL_DIR`` says: its last checkpoint, and validation NLLs at
  steps 250 and 500 (2.25 and 2.0: the best at 500)."""
  run = Path(bound["MODEL_DIR"].strip("'"))
  (run / "checkpoints" / bound["TRAIN_STEPS"]).mkdir(parents=True)
  (run / "eval").mkdir()
  (run / "eval" / "metrics.jsonl").write_text("".join(
      json.dumps({"step": s, "nll": abs(s - 500) / 1000 + 2}) + "\n" for s in (250, 500)))
