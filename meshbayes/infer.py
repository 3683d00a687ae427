"""Decode a file: ``python -m meshbayes.infer --gin_file=<example> --gin_file=runs/infer.gin
--gin.MODEL_DIR="'/path'" --gin.INPUT_FILE="'in.txt'" --gin.OUTPUT_FILE="'out.txt'"``.

See ``meshbayes.inference.infer`` for what gin configures.
"""

from meshbayes.launch import run


def main() -> None:
  run("meshbayes.infer", "infer")


if __name__ == "__main__":
  main()
