"""``research.averaging``: every averaging strategy behind one call.

The implementation is :mod:`research.comm.calling` (below the training layer,
so a strategy's own ``averaging`` form can build it); this module re-exports
it, and imports :mod:`research.train` so that the strategies declared there
(``layerwise``) are known by name too.
"""

from __future__ import annotations

import research.train  # noqa: F401  (declares research/train's strategies)
from research.comm.calling import Averaging, TopK, averaging, offered, wrap

__all__ = ["Averaging", "TopK", "averaging", "offered", "wrap"]
