"""Train a model: ``python -m meshbayes.train --gin_file=... --gin.MODEL_DIR="'/path'"``.

Running the same command again resumes from the latest checkpoint in MODEL_DIR.
See ``meshbayes.launch`` for the flags and ``meshbayes.trainer.train`` for what
gin configures.
"""

from meshbayes.launch import run


def main() -> None:
  run("meshbayes.train", "train")


if __name__ == "__main__":
  main()
