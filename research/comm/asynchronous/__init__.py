"""Asynchronous collectives: start one now on numpy buffers, wait for it later.

``progress`` is the rank's one background communication thread; ``handles``
starts collectives on it (:class:`~research.comm.asynchronous.handles.AsyncComm`)
and ``inflight`` is one collective on its way (the :class:`Handle` a caller
waits on). Used by the host-side strategies (partial, ps, sharded, layerwise).
"""
