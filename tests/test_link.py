"""The emulated link's spec parsing, cost formulas and labels (no MPI)."""

from __future__ import annotations

import dataclasses

import pytest

from research.comm.link import PAYLOAD, SUM_BYTES_PER_S, Link


@pytest.mark.parametrize(
    ("spec", "bits", "latency"),
    [
        ("10gbps", 10e9, 0.0),
        ("100gbps:2us", 100e9, 2e-6),
        ("2.5Gbps:0.5ms", 2.5e9, 0.5e-3),
        (" 100mbps:1s ", 100e6, 1.0),
        ("1tbps:300ns", 1e12, 300e-9),
        ("64kbps", 64e3, 0.0),
        (".5gbps:0us", 0.5e9, 0.0),
        ("10gbps:20us:cpu=5gbps", 10e9, 20e-6),
        ("1gbps:cpu=500mbps", 1e9, 0.0),
    ],
)
def test_parse_good_specs(spec, bits, latency):
    link = Link.parse(spec)
    assert link.emulated
    assert link.bits_per_s == pytest.approx(bits)
    assert link.latency_s == pytest.approx(latency)
    assert Link.parse(str(link)) == link  # the spec string round-trips
    assert (link.cpu_bits_per_s is not None) == ("cpu=" in spec)


def test_parse_cpu_ceiling():
    link = Link.parse("10gbps:20us:cpu=5gbps")
    assert link.cpu_bits_per_s == pytest.approx(5e9)
    assert str(link) == "10gbps:20us:cpu=5gbps"
    assert Link.parse("10gbps").cpu_bits_per_s is None


@pytest.mark.parametrize("spec", ["real", "REAL", None])
def test_parse_real(spec):
    link = Link.parse(spec)
    assert link == Link() and not link.emulated and str(link) == "real"
    assert link.allreduce(10**9, 8) == 0 and link.p2p(10**9) == 0


@pytest.mark.parametrize(
    "spec",
    ["", "10", "10gb", "gbps", "10 gbps", "10gbps:", "10gbps:2", "10gbps:2xs",
     "-1gbps", "0gbps", "10gbps:2us:3", "fast", "real:2us", "1e9bps",
     "10gbps:cpu=", "10gbps:cpu=0gbps", "10gbps:cpu=5", "10gbps:2us:cpu=5gbps:1",
     "10gbps:cpu=5gbps:2us"],
)  # fmt: skip
def test_parse_bad_specs(spec):
    with pytest.raises(ValueError, match="link"):
        Link.parse(spec)


def test_parse_wrong_type_and_invalid_fields():
    with pytest.raises(TypeError):
        Link.parse(10)
    with pytest.raises(ValueError):
        Link(bits_per_s=-1.0)
    with pytest.raises(ValueError):
        Link(bits_per_s=1e9, latency_s=-1e-6)
    with pytest.raises(ValueError):
        Link(latency_s=1e-6)
    with pytest.raises(ValueError):
        Link(cpu_bits_per_s=1e9)  # a ceiling needs a link
    with pytest.raises(ValueError):
        Link(bits_per_s=1e9, payload=0.0)
    with pytest.raises(ValueError):
        Link(bits_per_s=1e9, sum_bytes_per_s=0.0)


def test_ideal_costs_follow_the_ring_formulas():
    link = Link.parse("8gbps:3us").ideal()  # 1e9 bytes/s, all of it payload
    n, P, L, B = 4_000_000, 4, 3e-6, 1e9
    assert link.allreduce(n, P) == pytest.approx(2 * (P - 1) / P * n / B + 2 * 3 * L)
    assert link.reduce_scatter(n, P) == pytest.approx((P - 1) / P * n / B + 3 * L)
    assert link.allgather(n, P) == pytest.approx((P - 1) / P * n / B + 3 * L)
    assert link.alltoall(n, P) == pytest.approx(n / B + 3 * L)
    assert link.p2p(n) == pytest.approx(n / B + L)
    assert link.sparse(n, 5) == pytest.approx(n / B + 5 * L)
    # One rank moves nothing over a link; a point-to-point message still pays.
    assert link.allreduce(n, 1) == link.reduce_scatter(n, 1) == 0
    assert link.p2p(0) == pytest.approx(L)


def test_model_adds_headers_and_summing():
    link = Link.parse("8gbps:3us")
    n, P, L = 4_000_000, 4, 3e-6
    B = PAYLOAD * 1e9  # payload bytes per second
    part = (P - 1) / P * n
    S = SUM_BYTES_PER_S
    assert link.bytes_per_s == pytest.approx(B)
    assert link.allreduce(n, P) == pytest.approx(2 * part / B + 6 * L + part / S)
    assert link.reduce_scatter(n, P) == pytest.approx(part / B + 3 * L + part / S)
    assert link.allgather(n, P) == pytest.approx(part / B + 3 * L)
    assert link.alltoall(n, P) == pytest.approx(n / B + 3 * L)
    assert link.p2p(n) == pytest.approx(n / B + L)
    # Every corrected cost exceeds the bare formula's, the summing ones most.
    ideal = link.ideal()
    for cost in ("allreduce", "reduce_scatter", "allgather"):
        assert getattr(link, cost)(n, P) > getattr(ideal, cost)(n, P)
    assert link.summing(n) == pytest.approx(n / S)
    assert dataclasses.replace(link, sum_bytes_per_s=None).summing(n) == 0


def test_cpu_ceiling_caps_the_payload_rate():
    fast = Link.parse("100gbps:cpu=5gbps")
    assert fast.bytes_per_s == pytest.approx(5e9 / 8)
    assert fast.p2p(10**9) == pytest.approx(8.0 / 5)
    # A ceiling above the link's payload rate changes nothing.
    slow = Link.parse("1gbps:cpu=5gbps")
    assert slow.p2p(10**9) == pytest.approx(Link.parse("1gbps").p2p(10**9))
    assert fast.ideal().cpu_bits_per_s is None


def test_the_real_link_costs_nothing():
    link = Link()
    assert link.transfer(10**9) == link.summing(10**9) == link.sparse(10**9, 9) == 0
    assert link.bytes_per_s is None


def test_describe():
    assert Link.parse("10gbps:2us").describe() == "emulated 10 Gb/s, 2 us"
    assert Link.parse("100mbps").describe() == "emulated 100 Mb/s, 0 us"
    assert Link.parse("2.5gbps:1.5ms").describe() == "emulated 2.5 Gb/s, 1.5 ms"
    assert Link().describe() == "real link"
    assert Link().describe(node_local=True) == "real shared-memory link"
    assert Link().describe(node_local=False) == "real network link"
    assert (
        Link.parse("10gbps:20us:cpu=5gbps").describe()
        == "emulated 10 Gb/s, 20 us, cpu 5 Gb/s"
    )
