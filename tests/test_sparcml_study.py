"""The SparCML study's pure parts: link-adjusted cost model, crossover, checks."""

from __future__ import annotations

from research.comm.link import Link
from research.comm.sparse.cost import DEFAULTS, choose
from research.comm.sparse.mean import link_model
from research.studies.sparcml import bench_checks, train_checks, verdict
from research.studies.sparcml_commbound import comm_bound_checks
from research.studies.sparcml_plots import crossover

DIM = 1_000_000


def test_link_model_real_is_the_model_and_emulated_is_slower():
    assert link_model(DEFAULTS, Link(), 4) is DEFAULTS
    slow = link_model(DEFAULTS, Link.parse("1gbps:10us"), 4)
    assert slow.beta >= 8e-9 and slow.alpha > DEFAULTS.alpha
    assert slow.ar_beta >= 2 * 3 / 4 * 8e-9


def test_slow_link_favours_sparse_at_low_density():
    slow = link_model(DEFAULTS, Link.parse("1gbps"), 4)
    assert choose(slow, [DIM // 1000] * 4, DIM, 4, 4) != "dense"
    assert choose(slow, [DIM // 2] * 4, DIM, 4, 4) in ("dense", "dsar_sag")
    at = crossover(slow, DIM, 4)
    assert at is not None and 1e-3 < at < 1


def _rows(auto_s: float, dense_s: float, sparse_s: float, bytes_ratio: float):
    rows = []
    for density in (0.001, 0.01, 0.1, 0.5):
        for alg, t in (
            ("ssar_rd", sparse_s),
            ("ssar_sag", sparse_s),
            ("dsar_sag", sparse_s),
            ("dense", dense_s),
            ("auto", auto_s),
        ):
            rows.append(
                {
                    "P": 4,
                    "density": density,
                    "algorithm": alg,
                    "chosen": "ssar_sag",
                    "chosen_emulated": "ssar_sag",
                    "real_s": t,
                    "emulated_s": t,
                    "bytes": 1000 * bytes_ratio,
                    "model_bytes": 1000,
                }
            )
    return rows


def test_checks_pass_and_fail_on_the_numbers():
    link = Link.parse("10gbps")
    good = bench_checks(_rows(0.05, 1.0, 0.05, 1.01), link)
    assert good and all(c.startswith("PASS") for c in good), good
    bad = bench_checks(_rows(0.5, 1.0, 0.05, 1.2), link)
    fails = [c for c in bad if c.startswith("FAIL")]
    assert any("sparse (auto) / dense" in c for c in fails)
    assert any("auto / best fixed" in c for c in fails)
    assert any("measured bytes / model" in c for c in fails)


def _arm(name, accs):
    import statistics

    return {
        "arm": name,
        "seeds": list(range(len(accs))),
        "final_accs": accs,
        "final_test_acc": statistics.fmean(accs),
        "final_acc_std": statistics.stdev(accs) if len(accs) > 1 else 0.0,
    }


def test_accuracy_checks_say_undecided_when_the_interval_straddles():
    assert verdict(0.1, 0.4, 0.5) == "PASS"
    assert verdict(0.6, 0.9, 0.5) == "FAIL"
    assert verdict(0.2, 0.9, 0.5) == "UNDECIDED"
    assert verdict(1.5, 2.0, 1.0, above=True) == "PASS"
    # Tight seeds: a 0.2-point gap passes; noisy seeds with a 0.8 gap: undecided.
    tight = train_checks(
        [_arm("dense", [0.90, 0.901]), _arm("topk_ef", [0.898, 0.899])]
    )
    assert tight[0].startswith("PASS"), tight
    noisy = train_checks([_arm("dense", [0.90, 0.92]), _arm("topk_ef", [0.89, 0.914])])
    assert noisy[0].startswith("UNDECIDED") and "+-" in noisy[0], noisy
    one = train_checks([_arm("dense", [0.9]), _arm("topk_ef", [0.8])])
    assert one[0].startswith("UNDECIDED") and "one seed" in one[0]


def test_comm_bound_check_compares_time_to_target_on_emulated_links_only():
    def row(link, arm, t, step):
        return {
            "model": "candle_p1b2",
            "link": link,
            "arm": arm,
            "time_to_target_s": t,
            "mean_step_s": step,
            "final_test_acc": 0.5,
            "target": 0.3,
        }

    rows = [
        row("10gbps", "dense", 20.0, 0.4),
        row("10gbps", "topk_ef", 12.0, 0.25),
        row("real", "dense", 5.0, 0.1),
        row("real", "topk_ef", 9.0, 0.2),
    ]
    checks = comm_bound_checks(rows)
    assert len(checks) == 1 and checks[0].startswith("PASS"), checks
    rows[1]["time_to_target_s"] = None
    assert comm_bound_checks(rows)[0].startswith("FAIL  candle_p1b2, 10gbps")


def test_comm_bound_check_says_where_the_time_goes():
    """A FAIL carries its reason in numbers: each arm's phases, and the
    selection's cost against what the smaller allreduce saves."""
    base = {"model": "candle_p1b2", "link": "10gbps", "final_test_acc": 0.5}
    rows = [
        {
            **base,
            "arm": "dense",
            "time_to_target_s": 20.0,
            "mean_step_s": 0.63,
            "target": 0.25,
            "phases_ms": {"compute": 250.0, "comm": 165.0, "update": 121.0},
        },
        {
            **base,
            "arm": "topk_ef",
            "time_to_target_s": 21.0,
            "mean_step_s": 0.64,
            "target": 0.25,
            "phases_ms": {"compute": 238.0, "select": 125.0, "comm": 108.0},
        },
    ]
    rows[0]["curve"] = [(10, 0.1), (20, 0.26)]
    rows[1]["curve"] = [(10, 0.1), (20, 0.2), (30, 0.3)]
    (check,) = comm_bound_checks(rows)
    assert check.startswith("FAIL")
    assert "top-k compute 238 + select 125 + comm 108" in check
    assert "dense compute 250 + comm 165 + update 121" in check
    assert "selection 125 ms against 57 ms the smaller allreduce saves" in check
    assert "reached at step 30 vs 20" in check


def test_real_network_rows_get_the_checks_shared_memory_rows_do_not():
    from research.studies.sparcml import format_bench
    from research.studies.sparcml_commbound import format_comm_bound

    def row(link, arm, t, step, nodes):
        return {
            "model": "candle_p1b2",
            "link": link,
            "link_label": "real network link, 4 nodes at 1gbit per node",
            "nodes": nodes,
            "arm": arm,
            "time_to_target_s": t,
            "mean_step_s": step,
            "final_test_acc": 0.5,
            "target": 0.3,
            "bytes_per_step": 1e6,
        }

    net = [row("real", "dense", 20.0, 0.4, 4), row("real", "topk_ef", 9.0, 0.2, 4)]
    (check,) = comm_bound_checks(net)
    assert check.startswith("PASS  candle_p1b2, real network, 4 nodes: top-k + EF")
    assert format_comm_bound(net).splitlines()[-1] == (
        "real: real network link, 4 nodes at 1gbit per node"
    )
    shm = [row("real", "dense", 5.0, 0.1, 1), row("real", "topk_ef", 9.0, 0.2, 1)]
    assert comm_bound_checks(shm) == []
    assert "real:" not in format_comm_bound(shm)
    # The micro-benchmark on the real link names it in its lines and its head.
    bench = _rows(0.05, 1.0, 0.05, 1.0)
    checks = bench_checks(bench, Link(), "real network, 4 nodes")
    assert checks[0].startswith("PASS  real network, 4 nodes, P=4, density 0.001")
    assert format_bench(bench, Link(), "link: the network").startswith(
        "link: the network\n"
    )
    assert format_bench(bench, Link.parse("1gbps")).startswith("emulated link: ")
