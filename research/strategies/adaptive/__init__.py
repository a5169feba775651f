"""The ``adaptive`` strategy: dense, top-k sparse or partial, chosen while it trains.

::

    avg = research.averaging("adaptive", world, densities="0.01,0.001")
    for step in ...:
        grads = grad_fn(params, batch)
        grads, info = avg(grads)          # info.extra["method"]: what ran
        params, opt = apply(params, opt, grads)

or ``experiments.train --strategy adaptive``. It runs one of its candidates at a
time, the existing strategies themselves: ``host`` (the dense allreduce),
``sparse`` at each of ``densities`` (top-k with error feedback), ``majority``
and ``solo`` (eager-SGD's partial collectives, staleness bounded by
``staleness``). It predicts what each would cost now from a model fitted to
the running one's own steps (the link's rate, each rank's lateness) and
switches to the one that makes progress fastest (:mod:`.policy` says how,
:mod:`.model` what is fitted). Every rank stamps every step with its figures;
the stamps are exchanged (:mod:`.exchange`) and every rank decides alike from
them.

A switch carries what the old method had not delivered into the new one:
top-k's error-feedback residual (handed to another density,
or added to the next method's first gradient), the gradients a partial
collective carried (taken back and added likewise), so every computed
gradient is applied exactly once; every candidate keeps its buffers and
communicators for the whole run, so a switch costs no set-up.

Options (``--strategy-opt KEY=VALUE``; ranges checked before launch):

* ``candidates``: ``host,sparse,majority,solo`` (``host`` required);
* ``densities``: top-k densities, ``0.01``;
* ``margin``: least relative gain (time to progress) a switch needs, 0.1;
* ``settle``: measured steps of a method before it is left, 3;
* ``error_bound``, ``patience``, ``probe_steps``: the model is not trusted
  when its error stays above 0.3 for 20 steps; a probe then runs the next
  best candidate for 3 steps;
* ``delay_cost``: what a step whose gradients are applied one step late is
  worth less, 0.02; ``dense_steps``: dense only for the first 10 steps;
* ``max_lag``, ``cooldown``, ``interval``: the guard: top-k is left when its
  residual holds more than 10 gradients' worth of update (measured every 20
  steps of it), for 5 x 20 steps;
* ``staleness``: the partial collectives' full round every this many rounds, 8;
* ``plan``: fixed switches instead of the model's, ``host@0,sparse:0.01@40``;
* ``allreduce``, ``seed``, ``link``: as for ``host``, ``majority``, all.

Each switch is one line on rank 0 and a row ``kind: "switch"`` in
``metrics.jsonl`` (each change the model saw a row ``kind: "change"``), a span
on the timeline's ``strategy`` track; ``summary.json`` gives the time and steps
in each method, the switches, the probes and their seconds.

Its modules, lowest first: ``candidates`` (the methods and the plan, read from
text options; no MPI), ``stamp``, ``exchange``, ``changepoint``, ``model`` and
``policy`` (what a window of steps measured, and the decisions), ``seeding``
(every candidate measured once before the first step), ``call`` (the one call
in a user's loop) and ``trainer`` (its steps under the Trainer), ``strategy``
(its options and the one object, which is both).
"""

from research.strategies.adaptive.strategy import Adaptive, AdaptiveOptions

__all__ = ["Adaptive", "AdaptiveOptions"]
