"""What an experiment's ranks do to their own process, which they own."""

from __future__ import annotations

import gc


def freeze_imports() -> None:
    """Import the Trainer, then move everything alive out of the cyclic garbage
    collector's sight (``gc.freeze``).

    Tracing makes many short-lived objects, and each full collection walked the
    whole import-time heap (JAX, Flax, Orbax) again: a 60-step 2-rank
    ``experiments.train`` run took 17-23% less CPU with it here. Nothing is
    lost: what is alive after the imports stays alive anyway (a collection at
    that point finds nothing). Only the experiments' job starts call this; a
    library user's process is left as it is.
    """
    import research.train.loop  # noqa: F401  (the bulk of what a job imports)

    gc.freeze()
