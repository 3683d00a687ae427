"""Device meshes, logical axis rules and train-state shardings (issue 3 fills this in)."""
