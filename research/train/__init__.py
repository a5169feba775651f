"""Training: TrainState, optimizer and schedules, pure steps, the loop.

Importing it makes the strategies declared here (``layerwise``) known to
:mod:`research.comm.declared` by their source (``research.comm`` knows
nothing of this layer).
"""

from pathlib import Path as _Path

from research.comm import declared as _declared

_declared.add_root(_Path(__file__).parent)
