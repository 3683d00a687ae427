"""Decode a file: ``python -m meshbayes.infer --gin_file=runs/infer.gin
--gin_file=tasks/synthetic.gin --gin.MODEL_DIR="'/path'" --gin.BATCH_SIZE=8
--gin.INPUT_FILE="'in.txt'" --gin.OUTPUT_FILE="'out.txt'"``.

The model is the training run's unless the command line says otherwise. What gin
configures: ``meshbayes.evaluation.inference.infer``. It writes OUTPUT_FILE,
OUTPUT_FILE.scores.jsonl and, last, OUTPUT_FILE.manifest.json (what makes them one
unit), holding OUTPUT_FILE.lock meanwhile: a second infer to that output stops with one
line naming the first.
"""

from meshbayes.launch import run
from meshbayes.runtime import host_memory


def main() -> None:
  host_memory.exec_with_malloc_tunables()  # before anything: glibc reads it at start-up
  run("meshbayes.infer", "infer", model_from_model_dir=True)


if __name__ == "__main__":
  main()
