"""Device meshes, logical axis rules and train-state shardings.

Models name axes; this package places them. It knows nothing of models: it reads logical
axis names off boxed parameters (``nn.LogicallyPartitioned``) and derives the rest.
"""

from meshbayes.partitioning.data import DataLayout, data_layout, global_batch, shard_readers
from meshbayes.partitioning.inspection import Placement, format_table, placements
from meshbayes.partitioning.mesh import (
                               DATA_AXIS,
                               MESH_AXES,
                               MODEL_AXIS,
                               create_mesh,
                               resolve_axis_sizes,
                               simulate_cpu_devices,
)
from meshbayes.partitioning.partitioner import Partitioner
from meshbayes.partitioning.rules import (
                               PRESETS,
                               LogicalRules,
                               data_only_rules,
                               logical_to_mesh_spec,
                               resolve_rules,
                               standard_rules,
                               validate_rules,
)
from meshbayes.partitioning.specs import logical_specs, param_logical_specs

__all__ = [
                               "DATA_AXIS",
                               "MESH_AXES",
                               "MODEL_AXIS",
                               "PRESETS",
                               "DataLayout",
                               "LogicalRules",
                               "Partitioner",
                               "Placement",
                               "create_mesh",
                               "data_layout",
                               "data_only_rules",
                               "format_table",
                               "global_batch",
                               "logical_specs",
                               "logical_to_mesh_spec",
                               "param_logical_specs",
                               "placements",
                               "resolve_axis_sizes",
                               "resolve_rules",
                               "shard_readers",
                               "simulate_cpu_devices",
                               "standard_rules",
                               "validate_rules",
]
