"""Models built from meshbayes layers: the Bayesian Transformer (issue 4 fills this in)."""
