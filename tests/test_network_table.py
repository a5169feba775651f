"""The network page's table: model, emulation and host ceiling (no MPI)."""

from __future__ import annotations

import json

import pytest

from research.comm.link import Link
from research.studies import network, sparcml_bench


def _job(link: str, exchange_gbps: float, rows: list[dict], ranks: int = 2) -> dict:
    return {
        "ranks": ranks,
        "nodes": ranks,
        "link": link,
        "calibration": {
            "one_way_s": 20e-6,
            "exchange_bytes_per_s": exchange_gbps * 1e9 / 8,
            "add_bytes_per_s": 7e9,
        },
        "rows": rows,
        "load_average": [1.0, 1.0, 1.0],
        "load_average_end": [1.5, 1.0, 1.0],
    }


def test_model_of_charges_what_the_link_says():
    link = Link.parse("1gbps:10us")
    assert network.model_of(link, ["allreduce", 10**6], 4) == link.allreduce(10**6, 4)
    assert network.model_of(link, ["alltoall", 10**6], 4) == link.alltoall(10**6, 4)
    assert network.model_of(link, ["p2p", 10**6], 4) == link.p2p(10**6)
    assert network.model_of(link, ["sparse", 10**6, 3], 4) == link.sparse(10**6, 3)


def test_emulation_holds_a_call_until_the_model_has_passed():
    assert network.emulated(0.2, 0.5) == 0.5
    assert network.emulated(0.7, 0.5) == 0.7


def test_the_sparse_strategy_adds_the_link_to_its_own_time():
    # Measured over TCP: the merges are CPU work between the transfers.
    assert network.emulated(0.2, 0.5, additive=True) == pytest.approx(0.7)
    link = Link.parse("1gbps:10us")
    assert sparcml_bench._emulated(0.02, 10**6, 3, link) == pytest.approx(
        0.02 + link.sparse(10**6, 3)
    )


def test_the_host_ceiling_comes_from_a_short_exchange_only():
    # 1 Gb/s carries 0.93 Gb/s of payload; an exchange near that rate leaves
    # the link alone, one well below it becomes cpu=.
    assert network.job_link(_job("1gbps:0us", 0.95, [])).cpu_bits_per_s is None
    assert network.job_link(_job("1gbps:0us", 0.90, [])).cpu_bits_per_s is None
    capped = network.job_link(_job("10gbps:0us", 4.9, []))
    assert capped.cpu_bits_per_s == pytest.approx(4.9e9)
    # The measured one-way time of 8 bytes is the latency per step.
    assert str(capped) == "10gbps:20us:cpu=4.9gbps"


def test_the_handles_get_the_slower_of_both_exchanges():
    job = _job("10gbps:0us", 8.0, [])
    assert network.job_link(job, "handles").cpu_bits_per_s == pytest.approx(8e9)
    job["calibration"]["handle_exchange_bytes_per_s"] = 6.1e9 / 8
    assert network.job_link(job, "blocking").cpu_bits_per_s == pytest.approx(8e9)
    assert network.job_link(job, "handles").cpu_bits_per_s == pytest.approx(6.1e9)
    assert network.path_of("allreduce ring") == "blocking"
    assert network.path_of("sparse ssar_rd") == "blocking"
    assert network.path_of("allreduce mpi") == "handles"
    with pytest.raises(ValueError, match="path must be"):
        network.job_link(job, "rdma")


def test_table_and_render(tmp_path):
    link = Link.parse("1gbps")
    nb = 16 * 10**6
    # Measured exactly what the model says at 2 ranks: error +0%.
    exact = link.allreduce(nb, 2)
    rows = [
        {
            "collective": "allreduce ring",
            "size": "16 MB",
            "times_s": [exact * 0.99, exact, exact * 1.2],
            "costs": [["allreduce", nb], ["allreduce", nb]],
        },
        {
            "collective": "sparse ssar_rd",
            "size": "0.01 density",
            "times_s": [0.05, 0.05, 0.05],
            "costs": [["sparse", 10**6, 2], ["sparse", 4 * 10**6, 2]],
        },
    ]
    shm = _job("1gbps:0us", 20.0, [dict(rows[1], times_s=[0.02] * 3)])
    shm["nodes"] = 1
    (tmp_path / "results.json").write_text(
        json.dumps({"jobs": [_job("1gbps:0us", 0.95, rows)], "one_node": [shm]})
    )
    table = network.render(tmp_path)
    assert (tmp_path / "table.md").read_text() == table
    ring = next(line for line in table.splitlines() if "allreduce ring" in line)
    assert ring.endswith("| +0% |")
    # The sparse row: the slowest rank's 4 MB on the link (20 us measured per
    # message) on top of the 20 ms the call took on one node.
    sparse = next(line for line in table.splitlines() if "ssar_rd" in line)
    want = 0.02 + Link.parse("1gbps:20us").sparse(4 * 10**6, 2)
    assert f"| {want * 1e3:.3g} |" in sparse
    assert "median: 2 of 2 points (before the corrections: 1)" in table
    assert "| one node | 2 |" in table
    # The summaries: by link and node count, then by collective.
    assert "| 1 Gb/s, 2 nodes | 2 of 2 | " in table
    row = "| sparse ssar_rd | 1 of 1 | 9% | +9% (1 Gb/s, 2 nodes, 0.01 density) |"
    assert row in table
