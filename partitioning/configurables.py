"""Registers the partitioning layer with gin, for configuration files.

Importing it makes ``partitioning.Partitioner``, ``standard_rules`` and ``data_only_rules``
configurable (the library itself does not depend on gin)::

  include 'partitioning/fsdp_tp.gin'
  partitioning.Partitioner.model = 4
  partitioning.Partitioner.additional_rules = [('experts', 'data')]
"""

import gin

from meshbayes.partitioning.partitioner import Partitioner
from meshbayes.partitioning.rules import data_only_rules, standard_rules

gin.external_configurable(Partitioner, module="partitioning")
gin.external_configurable(standard_rules, module="partitioning")
gin.external_configurable(data_only_rules, module="partitioning")
