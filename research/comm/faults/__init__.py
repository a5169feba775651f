"""Faults: a stalled collective reported and the job ended; nothing left behind.

``watchdog`` watches every wait and ends the job within a bound; ``rollcall``
and ``traffic`` tell it which ranks answer and which bytes still move;
``failures`` records why a rank ended the job (for the launcher that restarts
it); ``lifeline`` makes every process die with what started it.
"""
