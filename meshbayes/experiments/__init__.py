"""The uncertainty experiment ("is being Bayesian worth it") as a library.

- ``recipes``: the experiment's view of each predictive method (the recipe that trains
  its runs, its seed spread, what its evaluations add, its report columns);
- ``plan``: what an experiment trains and evaluates, and what its runs wrote;
- ``run``: the runner of its training and evaluation commands, and its presets;
- ``schedule``: the order an experiment runs in and its stop rule;
- ``selections``: which measures of the registry each report table shows;
- ``compare``, ``tables``, ``verdicts``, ``band_verdicts``, ``report``: its tables and
  report.

The commands are ``python -m meshbayes.tools.experiment`` (and ``experiment_report``,
``experiment_verdicts``, ``compare_runs``), thin front-ends of these modules. Importing
this package imports none of them.
"""
