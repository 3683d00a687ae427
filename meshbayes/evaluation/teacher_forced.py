"""The old path of ``meshbayes.training.teacher_forced`` (moved so that training imports
nothing of evaluation); it goes in the next release. Importing it gives the new module
itself, so a patch through either name reaches the same code."""

import sys
import warnings

from meshbayes.training import teacher_forced as _moved

warnings.warn("meshbayes.evaluation.teacher_forced moved to meshbayes.training.teacher_forced; "
              "the old path goes in the next release", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
