"""Offline examples of the layer library (the Bayesian Layers paper's), each a command.

``python -m meshbayes.examples.NAME --output_dir DIR`` writes ``NAME.png`` and
``NAME.json``; sizes default to the full run (``--help``), the tests run each at
toy size. docs/examples.md describes each example and what it shows.
"""
