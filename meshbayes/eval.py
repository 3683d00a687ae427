"""Evaluate a checkpoint: ``python -m meshbayes.eval --gin_file=<example> --gin_file=runs/eval.gin
--gin.MODEL_DIR="'/path'"``.

Teacher-forced metrics and decoding on a split; writes
``MODEL_DIR/eval/<task>/metrics.json`` and ``predictions.jsonl``. See
``meshbayes.evaluation.evaluate`` for what gin configures.
"""

from meshbayes.launch import run


def main() -> None:
  run("meshbayes.eval", "evaluate")


if __name__ == "__main__":
  main()
