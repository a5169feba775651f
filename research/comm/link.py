"""An emulated network link: what a collective would cost on a given network.

On a laptop every rank talks through shared memory: moving bytes costs CPU time
of the ranks themselves, and nothing can be hidden behind computation. On a
cluster a NIC moves the bytes while the CPU is free. A :class:`Link` models the
latter with latency + bytes / bandwidth per algorithm step, and the handle engine
(:mod:`research.comm.handles`) makes each collective also *sleep* on the progress
thread until the modelled time has passed, so the CPU stays free exactly as while
a NIC moves data. Results must say which link they ran on (:meth:`Link.describe`).

Spec strings (case-insensitive)::

    real              no emulation (the default): collectives take what they take
    10gbps            10 Gb/s, no latency
    100gbps:2us       100 Gb/s and 2 microseconds per message
    2.5gbps:0.5ms     units: kbps mbps gbps tbps (decimal bits/s); ns us ms s

Costs of the algorithms, P ranks, n bytes, bandwidth B (bytes/s), latency L:

================================  =====================================
ring allreduce of n bytes         2 (P-1)/P n / B + 2 (P-1) L
reduce-scatter (n: whole input)   (P-1)/P n / B + (P-1) L
allgather (n: whole output)       (P-1)/P n / B + (P-1) L
alltoall(v) (s: bytes sent to     s / B + (P-1) L
other ranks by this rank)
point-to-point of n bytes         n / B + L
================================  =====================================
"""

from __future__ import annotations

import dataclasses
import re

_RATE_UNITS = {"kbps": 1e3, "mbps": 1e6, "gbps": 1e9, "tbps": 1e12}
_TIME_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
_NUMBER = r"(\d+(?:\.\d*)?|\.\d+)"
_SPEC = re.compile(
    rf"^{_NUMBER}({'|'.join(_RATE_UNITS)})(?::{_NUMBER}({'|'.join(_TIME_UNITS)}))?$"
)
_FORMS = "'real', '<rate>' or '<rate>:<latency>', e.g. '10gbps', '100gbps:2us'"


@dataclasses.dataclass(frozen=True)
class Link:
    """A link's bandwidth and latency; ``bits_per_s=None`` is the real link.

    Attributes:
      bits_per_s: bandwidth in bits per second (None: no emulation).
      latency_s: seconds per message step (0 with the real link).
    """

    bits_per_s: float | None = None
    latency_s: float = 0.0

    def __post_init__(self) -> None:
        if self.bits_per_s is not None and not self.bits_per_s > 0:
            raise ValueError(f"link bandwidth must be > 0, got {self.bits_per_s}")
        if not self.latency_s >= 0:
            raise ValueError(f"link latency must be >= 0, got {self.latency_s}")
        if self.bits_per_s is None and self.latency_s:
            raise ValueError("the real link takes no latency; give a bandwidth too")

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
        rate, rate_unit, lat, lat_unit = m.groups()
        bits = float(rate) * _RATE_UNITS[rate_unit]
        if bits <= 0:
            raise ValueError(f"bad link spec {spec!r}: bandwidth must be > 0")
        latency = float(lat) * _TIME_UNITS[lat_unit] if lat is not None else 0.0
        return cls(bits_per_s=bits, latency_s=latency)

    @property
    def emulated(self) -> bool:
        return self.bits_per_s is not None

    # -- costs (seconds; 0 for the real link) ---------------------------------------
    def transfer(self, nbytes: float) -> float:
        """Seconds to push ``nbytes`` through the link (no latency)."""
        return 0.0 if self.bits_per_s is None else 8.0 * nbytes / self.bits_per_s

    def allreduce(self, nbytes: int, size: int) -> float:
        """Ring allreduce of ``nbytes`` (each rank's buffer) over ``size`` ranks."""
        steps = size - 1
        return 2 * self.transfer(steps / size * nbytes) + 2 * steps * self.latency_s

    def reduce_scatter(self, nbytes: int, size: int) -> float:
        """Ring reduce-scatter of an ``nbytes`` input into ``size`` blocks."""
        steps = size - 1
        return self.transfer(steps / size * nbytes) + steps * self.latency_s

    def allgather(self, nbytes: int, size: int) -> float:
        """Ring allgather producing ``nbytes`` on every rank (all blocks)."""
        return self.reduce_scatter(nbytes, size)

    def alltoall(self, sent_bytes: int, size: int) -> float:
        """All-to-all(v) where this rank sends ``sent_bytes`` to the others."""
        return self.transfer(sent_bytes) + (size - 1) * self.latency_s

    def p2p(self, nbytes: int) -> float:
        """One point-to-point message of ``nbytes``."""
        return self.transfer(nbytes) + (self.latency_s if self.emulated else 0.0)

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
        return f"emulated {_rate_label(self.bits_per_s)}, {_time_label(self.latency_s)}"

    def __str__(self) -> str:
        """The spec string this link parses from (round trip)."""
        if self.bits_per_s is None:
            return "real"
        rate = _rate_label(self.bits_per_s).replace(" ", "").replace("b/s", "bps")
        lat = _time_label(self.latency_s).replace(" ", "")
        return f"{rate.lower()}:{lat}"


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
