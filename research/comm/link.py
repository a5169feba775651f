"""An emulated network link: what a collective would cost on a given network.

On a laptop every rank talks through shared memory: moving bytes costs CPU time
of the ranks themselves, and nothing can be hidden behind computation. On a
cluster a NIC moves the bytes while the CPU is free. A :class:`Link` models the
latter with latency + bytes / bandwidth per algorithm step, and the handle engine
(:mod:`research.comm.asynchronous.handles`) makes each collective also *sleep* on the
progress thread until the modelled time has passed, so the CPU stays free exactly as
while a NIC moves data. Results must say which link they ran on (:meth:`Link.describe`).

Spec strings (case-insensitive)::

    real              no emulation (the default): collectives take what they take
    10gbps            a 10 Gb/s link carrying TCP, no latency
    100gbps:2us       100 Gb/s and 2 microseconds per message
    2.5gbps:0.5ms     units: kbps mbps gbps tbps (decimal bits/s); ns us ms s
    10gbps:20us:cpu=5gbps   and a host that moves at most 5 Gb/s of TCP payload
                      each way per rank (its CPU, not the link, is the limit)

Costs of the algorithms, P ranks, n bytes, payload rate B = min(PAYLOAD x rate,
cpu) in bytes/s, latency L, summing rate S = SUM_BYTES_PER_S:

================================  ==============================================
ring allreduce of n bytes         2 (P-1)/P n / B + 2 (P-1) L + (P-1)/P n / S
reduce-scatter (n: whole input)   (P-1)/P n / B + (P-1) L + (P-1)/P n / S
allgather (n: whole output)       (P-1)/P n / B + (P-1) L
alltoall(v) (s: bytes sent to     s / B + (P-1) L
other ranks by this rank)
point-to-point of n bytes         n / B + L
sparse allreduce (s bytes sent    s / B + m L (the sparse strategy adds it to
in m messages, ``SparseStats``)   the call's own time: its merges are CPU work
                                  between the steps' transfers; the handles and
                                  the host ring hold a call until max(its own
                                  time, the model))
================================  ==============================================

The constants and what they stand for, measured over TCP between nodes of a
local cluster (``research/localnet.py``, ``python -m scripts.bench_link``; the
table, its date and machine: ``docs/results/network.md``):

==================  =======  ===================================================
``PAYLOAD``         0.93     payload per byte the link carries with data in
                             both directions: 1448 of every 1514-byte frame
                             (Ethernet, IPv4, TCP with timestamps at MTU 1500)
                             and the other direction's ACKs (66-byte frames);
                             measured: 100 MB exchanged both ways between 2
                             nodes at 1 Gb/s, 0.93-0.95 Gb/s each way
``SUM_BYTES_PER_S`` 6.7e9    a reduction sums what it receives after it
                             arrives: ``numpy.add`` in place on 50 MB float32
                             arrays, 6.6-8.7 GB/s here (MPICH's own sum loop is
                             no faster)
``cpu=``            none     a spec option: the host's ceiling. Here 2 cores
                             serve every node: 100 MB exchanged both ways
                             reached 7.8 Gb/s per rank at 2 nodes and 4.9 at
                             4 on a 10 Gb/s link
==================  =======  ===================================================

The measured error of the model, collective by collective at 1 and 10 Gb/s, 2
and 4 nodes, is in ``docs/results/network.md`` (two sweeps): where the
link is slower than the host (1 Gb/s) a median error of 4-5% at 2 nodes and 5-21%
at 4 (2 cores serve 4 nodes there), more than 10% off where MPI runs an algorithm
that moves more than the ring (MPICH's allreduce at 4 ranks: -37% at 100 MB);
where the host is the limit (10 Gb/s on 2 shared cores) the model is short by a
median 16-26%, most on 1 MB calls through the handles (their progress thread's
sleeping tests, not the link). Latency there is the measured one-way time of 8
bytes, 12-28 us. :meth:`Link.ideal` gives the
bare formulas (payload 1, no summing) that the model was before.
"""

from __future__ import annotations

import dataclasses
import re

#: Payload per byte the link carries (see the module docstring's table).
PAYLOAD = 0.93
#: Bytes per second a reduction sums (see the module docstring's table).
SUM_BYTES_PER_S = 6.7e9

_RATE_UNITS = {"kbps": 1e3, "mbps": 1e6, "gbps": 1e9, "tbps": 1e12}
_TIME_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
_NUMBER = r"(\d+(?:\.\d*)?|\.\d+)"
_RATE = rf"{_NUMBER}({'|'.join(_RATE_UNITS)})"
_SPEC = re.compile(
    rf"^{_RATE}(?::{_NUMBER}({'|'.join(_TIME_UNITS)}))?(?::cpu={_RATE})?$"
)
_FORMS = (
    "'real', '<rate>', '<rate>:<latency>' or '<rate>:<latency>:cpu=<rate>', "
    "e.g. '10gbps', '100gbps:2us', '10gbps:20us:cpu=5gbps'"
)


@dataclasses.dataclass(frozen=True)
class Link:
    """A link's bandwidth, latency and host ceiling; ``bits_per_s=None`` is the
    real link.

    Attributes:
      bits_per_s: the link's rate in bits per second (None: no emulation).
      latency_s: seconds per message step (0 with the real link).
      cpu_bits_per_s: the most TCP payload one rank's host moves each way, bits
        per second (None: no ceiling).
      payload: payload per byte the link carries (``PAYLOAD``; 1: bare formulas).
      sum_bytes_per_s: how fast a reduction sums (None: free).
    """

    bits_per_s: float | None = None
    latency_s: float = 0.0
    cpu_bits_per_s: float | None = None
    payload: float = PAYLOAD
    sum_bytes_per_s: float | None = SUM_BYTES_PER_S

    def __post_init__(self) -> None:
        if self.bits_per_s is not None and not self.bits_per_s > 0:
            raise ValueError(f"link bandwidth must be > 0, got {self.bits_per_s}")
        if not self.latency_s >= 0:
            raise ValueError(f"link latency must be >= 0, got {self.latency_s}")
        if self.bits_per_s is None and (self.latency_s or self.cpu_bits_per_s):
            raise ValueError("the real link takes no latency or cpu; give a bandwidth")
        if self.cpu_bits_per_s is not None and not self.cpu_bits_per_s > 0:
            raise ValueError(f"link cpu= must be > 0, got {self.cpu_bits_per_s}")
        if not 0 < self.payload <= 1:
            raise ValueError(f"link payload must be in (0, 1], got {self.payload}")
        if self.sum_bytes_per_s is not None and not self.sum_bytes_per_s > 0:
            raise ValueError(
                f"link summing rate must be > 0, got {self.sum_bytes_per_s}"
            )

    @classmethod
    def parse(cls, spec: str | Link | None) -> Link:
        """A link from a spec string (see module docstring); None means real."""
        if spec is None:
            return cls()
        if isinstance(spec, Link):
            return spec
        if not isinstance(spec, str):
            raise TypeError(f"link spec must be a string, got {type(spec).__name__}")
        text = spec.strip().lower()
        if text == "real":
            return cls()
        m = _SPEC.match(text)
        if m is None:
            raise ValueError(f"bad link spec {spec!r}: expected {_FORMS}")
        rate, rate_unit, lat, lat_unit, cpu, cpu_unit = m.groups()
        bits = float(rate) * _RATE_UNITS[rate_unit]
        cpu_bits = float(cpu) * _RATE_UNITS[cpu_unit] if cpu is not None else None
        if bits <= 0 or cpu_bits == 0:
            raise ValueError(f"bad link spec {spec!r}: rates must be > 0")
        latency = float(lat) * _TIME_UNITS[lat_unit] if lat is not None else 0.0
        return cls(bits_per_s=bits, latency_s=latency, cpu_bits_per_s=cpu_bits)

    @property
    def emulated(self) -> bool:
        return self.bits_per_s is not None

    def ideal(self) -> Link:
        """This link with the bare formulas: all of the rate is payload, summing
        is free, no host ceiling (the model before it was measured)."""
        return dataclasses.replace(
            self, cpu_bits_per_s=None, payload=1.0, sum_bytes_per_s=None
        )

    @property
    def bytes_per_s(self) -> float | None:
        """Payload bytes per second each way: min(payload x rate, cpu) / 8."""
        if self.bits_per_s is None:
            return None
        bits = self.payload * self.bits_per_s
        if self.cpu_bits_per_s is not None:
            bits = min(bits, self.cpu_bits_per_s)
        return bits / 8.0

    # -- costs (seconds; 0 for the real link) ---------------------------------------
    def transfer(self, nbytes: float) -> float:
        """Seconds to push ``nbytes`` of payload through the link (no latency)."""
        rate = self.bytes_per_s
        return 0.0 if rate is None else nbytes / rate

    def summing(self, nbytes: float) -> float:
        """Seconds a reduction spends summing ``nbytes`` it received."""
        if not self.emulated or self.sum_bytes_per_s is None:
            return 0.0
        return nbytes / self.sum_bytes_per_s

    def allreduce(self, nbytes: int, size: int) -> float:
        """Ring allreduce of ``nbytes`` (each rank's buffer) over ``size`` ranks."""
        steps = size - 1
        part = steps / size * nbytes
        return 2 * self.transfer(part) + 2 * steps * self.latency_s + self.summing(part)

    def reduce_scatter(self, nbytes: int, size: int) -> float:
        """Ring reduce-scatter of an ``nbytes`` input into ``size`` blocks."""
        steps = size - 1
        part = steps / size * nbytes
        return self.transfer(part) + steps * self.latency_s + self.summing(part)

    def allgather(self, nbytes: int, size: int) -> float:
        """Ring allgather producing ``nbytes`` on every rank (all blocks)."""
        steps = size - 1
        return self.transfer(steps / size * nbytes) + steps * self.latency_s

    def alltoall(self, sent_bytes: int, size: int) -> float:
        """All-to-all(v) where this rank sends ``sent_bytes`` to the others."""
        return self.transfer(sent_bytes) + (size - 1) * self.latency_s

    def p2p(self, nbytes: int) -> float:
        """One point-to-point message of ``nbytes``."""
        return self.transfer(nbytes) + (self.latency_s if self.emulated else 0.0)

    def sparse(self, sent_bytes: int, messages: int) -> float:
        """The link's part of a sparse allreduce in which this rank sent
        ``sent_bytes`` in ``messages`` messages (``SparseStats``)."""
        if not self.emulated:
            return 0.0
        return self.transfer(sent_bytes) + messages * self.latency_s

    # -- labels -----------------------------------------------------------------------
    def describe(self, node_local: bool | None = None) -> str:
        """A label for tables: ``"emulated 10 Gb/s, 2 us"`` or ``"real ... link"``.

        Args:
          node_local: for the real link, whether all ranks share one node (then
            "real shared-memory link"); None when unknown ("real link").
        """
        if self.bits_per_s is None:
            if node_local is None:
                return "real link"
            return "real shared-memory link" if node_local else "real network link"
        label = (
            f"emulated {_rate_label(self.bits_per_s)}, {_time_label(self.latency_s)}"
        )
        if self.cpu_bits_per_s is not None:
            label += f", cpu {_rate_label(self.cpu_bits_per_s)}"
        return label

    def __str__(self) -> str:
        """The spec string this link parses from (round trip)."""
        if self.bits_per_s is None:
            return "real"
        lat = _time_label(self.latency_s).replace(" ", "")
        spec = f"{_rate_spec(self.bits_per_s)}:{lat}"
        if self.cpu_bits_per_s is not None:
            spec += f":cpu={_rate_spec(self.cpu_bits_per_s)}"
        return spec


def _rate_spec(bits: float) -> str:
    return _rate_label(bits).replace(" ", "").replace("b/s", "bps").lower()


def _num(x: float) -> str:
    return f"{x:.6g}"


def _rate_label(bits: float) -> str:
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if bits >= scale:
            return f"{_num(bits / scale)} {unit}b/s"
    return f"{_num(bits / 1e3)} kb/s"


def _time_label(seconds: float) -> str:
    if seconds == 0:
        return "0 us"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{_num(seconds / scale)} {unit}"
    return f"{_num(seconds / 1e-9)} ns"
