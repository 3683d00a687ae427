"""Evaluate a checkpoint: ``python -m meshbayes.eval --gin_file=runs/eval.gin
--gin_file=tasks/synthetic.gin --gin.MODEL_DIR="'/path'" --gin.BATCH_SIZE=64``.

Teacher-forced metrics and decoding on a split, written to ``MODEL_DIR/eval/<task>/``;
the model is the training run's unless the command line says otherwise. What gin
configures: ``meshbayes.evaluation.evaluate``.
"""

from meshbayes.launch import run
from meshbayes.runtime import host_memory


def main() -> None:
  host_memory.exec_with_malloc_tunables()  # before anything: glibc reads it at start-up
  run("meshbayes.eval", "evaluate", model_from_model_dir=True)


if __name__ == "__main__":
  main()
