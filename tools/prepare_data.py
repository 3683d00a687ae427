"""Prepare the offline Tatoeba English-French corpus (what ``make data`` runs first).

  python -m meshbayes.tools.prepare_data [--data_dir=DIR] [--sdist=nmt-0.0.6.tar.gz] [--force]

Downloads the ``nmt==0.0.6`` source distribution with pip (unless ``--sdist``
names a copy), checks its SHA-256 and writes the splits, the Spanish OOD
sentences and the attribution under ``DIR/tatoeba/`` (default: the data
directory, ``$MESHBAYES_DATA_DIR`` or ``data/``); then the technical-English
OOD sentences from the installed scikit-learn under ``DIR/ood/``. Does nothing
when that is already prepared, unless ``--force``. See
``meshbayes/data/tatoeba.py`` and ``meshbayes/data/technical_english.py``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _summary(manifest: dict, corpus_dir: Path) -> str:
  lines = [f"Tatoeba en-fr in {corpus_dir}:"]
  for name, stats in manifest["splits"].items():
    lines.append(f"  {name:>10}: {stats['pairs']:>7,} pairs, {stats['english']:>7,} distinct "
                 f"English, {stats['french']:>7,} distinct French sentences")
  skipped = []
  for name, count in manifest["malformed"].items():
    invalid = manifest.get("invalid_utf8", {}).get(name)
    skipped.append(f"{count} ({name}{f', {invalid} not valid UTF-8' if invalid else ''})")
  lines.append(f"  malformed lines skipped: {', '.join(skipped)}; OOD Spanish sentences: "
               f"{manifest['ood_spanish']:,}")
  return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--data_dir", type=Path, default=None,
                      help="default: $MESHBAYES_DATA_DIR or <repository>/data")
  parser.add_argument("--sdist", type=Path, default=None,
                      help="a local copy of the nmt-0.0.6.tar.gz source distribution instead of "
                      "downloading it")
  parser.add_argument("--force", action="store_true", help="prepare again")
  args = parser.parse_args(argv)
  # Said first: loading the data layer (TensorFlow) takes seconds.
  print("prepare_data: preparing the Tatoeba English-French corpus (loading the data layer)",
        flush=True)
  # pylint: disable-next=import-outside-toplevel
  from meshbayes.data import paths, tatoeba, technical_english
  root = args.data_dir or paths.data_dir()
  start = time.perf_counter()
  try:
    count = technical_english.prepare(root, force=args.force)
    print(f"{technical_english.path(root)}: {count:,} technical English sentences (OOD)")
    manifest = None if args.force else tatoeba.read_manifest(root)
    if manifest is not None:
      print(f"{tatoeba.corpus_dir(root)} is already prepared (--force prepares it again)")
      return manifest
    if args.sdist:
      print(f"reading {args.sdist} into {tatoeba.corpus_dir(root)}", flush=True)
      manifest = tatoeba.prepare(root, args.sdist, progress=True)
    else:
      with tempfile.TemporaryDirectory(prefix="meshbayes-sdist-") as tmp:
        print(f"downloading {tatoeba.SDIST_REQUIREMENT} with pip", flush=True)
        sdist = tatoeba.download_sdist(tmp)
        print(f"reading {sdist.name} into {tatoeba.corpus_dir(root)}", flush=True)
        manifest = tatoeba.prepare(root, sdist, progress=True)
  except (OSError, ValueError, RuntimeError) as error:
    print(f"prepare_data: error: {error}", file=sys.stderr)
    raise SystemExit(1) from None
  print(_summary(manifest, tatoeba.corpus_dir(root)))
  print(f"  prepared in {time.perf_counter() - start:.1f} s")
  return manifest


if __name__ == "__main__":
  main()
