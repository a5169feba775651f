#!/usr/bin/env bash
# Every results page made again from new runs with today's code (issue 52).
#
#   bash scripts/regenerate_results.sh                  # every CPU page, in order
#   bash scripts/regenerate_results.sh eager_sgd adaptive   # only these pages
#   REHEARSE=1 bash scripts/regenerate_results.sh       # tiny runs, into a copy
#
# Run from a clean checkout of the commit whose code the pages should show, on
# the project's 2-core machine: each run goes one at a time under
# `flock /work/bench.lock` (BENCH_LOCK) into runs/final/<name> (RUNS), with a
# note of the machine's load and its busiest other processes as it started;
# `python -m scripts.results` then keeps each run's small files beside its page
# and renders the page and the README's paragraph from them, and at the end
# `python -m scripts.results --check --strict` must pass (no part left
# unchecked). The times are what each part took in the rehearsals and the
# measured defaults (docs/journal.md, 2026-12-02); about 4 hours in all, most
# of it the adaptive study (about 1 hour) and the real-network sections.
# docs/results/gpu.md is not made here: it needs a lent GPU (scripts/gpu_check.sh).
#
# REHEARSE=1: every command with tiny settings (a few steps, one or two seeds),
# rendered into a copy of the repository's docs and README under
# $RUNS/rehearsal-repo, then --check on that copy: the whole pipeline in about
# 25 minutes, the pages of the repository untouched.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
PY="${PY:-$REPO/.venv/bin/python}"
LOCK="${BENCH_LOCK:-/work/bench.lock}"
REHEARSE="${REHEARSE:-0}"
RUNS="${RUNS:-runs/final}"
CLUSTER=rg  # the local cluster's name (research/localnet), made and removed here
PAGES=(eager_sgd deepfreeze overlap sparcml scalability adaptive network)
[ $# -gt 0 ] && PAGES=("$@")

if [ "$REHEARSE" = 1 ]; then
    RUNS="$RUNS-rehearsal"
    ROOT="$RUNS/rehearsal-repo"  # the pages go to a copy of the repository's
    rm -rf "$ROOT"
    mkdir -p "$ROOT/docs"
    cp -r docs/results "$ROOT/docs/results"
    cp README.md "$ROOT/README.md"
else
    ROOT="$REPO"
fi
mkdir -p "$RUNS"

say() { echo "[regenerate $(date -u +%H:%M:%S)] $*"; }

# tiny NAME: the flags a rehearsal adds to NAME's command (none for the real runs).
tiny() {
    [ "$REHEARSE" = 1 ] || return 0
    case "$1" in
    eager_sgd*) echo "--steps 12 --eval-every 6 --reference-steps 6 --target-acc 0.2" ;;
    deepfreeze*) echo "--rounds 2 --window 4 --settle 2 --minor-rounds 1 --interval 4" \
        "--intervals 2 --model-opt features=256 --data-opt features=256" \
        "--data-opt n_train=256 --batch-size 8" ;;
    overlap-fcx) echo "--steps 6 --ranks 2" ;;
    overlap*) echo "--models resnet50 --steps 6" ;;
    sparcml-cb*) echo "--dim 200000 --reps 2 --cb-models candle_p1b2_tiny" \
        "--cb-steps 4 --cb-eval-every 2 --cb-target 0.05 --cb-seeds 0 1" ;;
    sparcml*) echo "--dim 200000 --reps 3 --steps 12 --eval-every 6 --seeds 0 1" \
        "--cb-models candle_p1b2_tiny --cb-steps 4 --cb-eval-every 2 --cb-target 0.05" ;;
    scalability*) echo "--models nt3 --nt3-features 512 --steps 6 --long-steps 6" \
        "--batch-size 4 --delays 0.05" ;;
    adaptive*) echo "--model candle_p1b2_tiny --model-opt features=256" \
        "--data-opt features=256 --data-opt n_train=512 --data-opt n_test=64" \
        "--batch-size 8 --steps 24 --eval-every 4 --seeds 3 --target-acc 0.05" \
        "--link-schedule 0:10gbit,8:1gbit,16:10gbit" \
        "--straggler random:k=1:seconds=0.02:start=12:end=18" ;;
    network*) echo "--reps 2" ;;
    esac
}

# run NAME CMD...: CMD (its flags, then tiny NAME's) under the lock into
# $RUNS/NAME, its note in $RUNS/NAME.note. Skipped where a finished run is there.
run() {
    local name=$1
    shift
    local dir="$RUNS/$name"
    if [ -f "$dir/run.json" ] && [ -f "$RUNS/$name.done" ]; then
        say "$name: done before, kept ($dir)"
        return 0
    fi
    rm -rf "$dir" "$RUNS/$name.done"
    # shellcheck disable=SC2046
    flock "$LOCK" bash -c '
        note=$1 dir=$2; shift 2
        others=$(ps -eo pcpu=,comm= --sort=-pcpu | awk "\$1 >= 5 {printf \"%s (%s%% CPU), \", \$2, \$1}")
        echo "Made by scripts/regenerate_results.sh at $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . || echo +dirty), one run at a time under flock '"$LOCK"'; as it started the 1-minute load was $(cut -d" " -f1 /proc/loadavg) and the busiest processes ${others:-none}." > "$note"
        echo "[regenerate $(date -u +%H:%M:%S)] $*"
        "$@" --run-dir "$dir"
    ' _ "$RUNS/$name.note" "$dir" "$@" $(tiny "$name")
    touch "$RUNS/$name.done"
}

# page [--section TITLE] NAME...: render the runs NAME... (each with its note).
page() {
    local section=()
    if [ "$1" = --section ]; then
        section=(--section "$2")
        shift 2
    fi
    local roots=() notes=()
    for name in "$@"; do
        roots+=("$RUNS/$name")
        notes+=(--note "$(cat "$RUNS/$name.note")")
    done
    "$PY" -m scripts.results "${roots[@]}" --root "$ROOT" "${section[@]}" "${notes[@]}"
}

# on_nodes N RATE CMD...: CMD with a local cluster of N nodes at RATE up.
on_nodes() {
    local n=$1 rate=$2
    shift 2
    scripts/cluster/localnet.sh --name "$CLUSTER" up "$n" --rate "$rate" >/dev/null
    local rc=0
    "$@" || rc=$?
    scripts/cluster/localnet.sh --name "$CLUSTER" down >/dev/null
    return $rc
}

NET="Real network (local cluster)"
EXP=("$PY" -m)

for p in "${PAGES[@]}"; do
    case "$p" in
    eager_sgd)
        # make run's command, 3 seeds: about 3 min. The section: 2 nodes x 2
        # ranks at 1 Gb/s, a whole node the straggler, 3 seeds: about 6 min.
        run eager_sgd "${EXP[@]}" experiments.eager_sgd --seeds 0 1 2 --no-progress
        on_nodes 2 1gbit run eager_sgd-net "${EXP[@]}" experiments.eager_sgd \
            --hosts n1,n2 --np 4 --seeds 0 1 2 --no-progress \
            --imbalance random:k=1:seconds=auto:how=spin:group=2
        page eager_sgd
        page --section "$NET" eager_sgd-net
        ;;
    deepfreeze)
        # The default (28 rounds, 1/2/4-rank jobs): about 3 min. The section: 2
        # nodes x 2 ranks at 1 Gb/s, 10 rounds: about 5 min.
        run deepfreeze "${EXP[@]}" experiments.deepfreeze --no-progress
        on_nodes 2 1gbit run deepfreeze-net "${EXP[@]}" experiments.deepfreeze \
            --hosts n1,n2 --np 4 --rounds 10 --sweep-ranks 1 2 --no-progress
        page deepfreeze
        page --section "$NET" deepfreeze-net
        ;;
    overlap)
        # The default (22 steps a run, 20 measured): about 15 min. Then what it
        # leaves out, information only: VGG-16's FC-activation exchange and the
        # layerwise bucket sweep: about 8 min. The section, on real networks: 2
        # nodes at 1 Gb/s; 4 nodes at 10 Gb/s (2 and 4 ranks); 2 nodes x 2 ranks
        # at 10 Gb/s: about 10, 15 and 10 min.
        run overlap "${EXP[@]}" experiments.overlap
        run overlap-fcx "${EXP[@]}" experiments.overlap --ranks 1 2 4 --models vgg16 \
            --strategies host layerwise overlap overlap-fcx --sweep-models vgg16
        local_flags=(--links real --strategies host fused layerwise overlap
            --models resnet50 vgg16)
        on_nodes 2 1gbit run overlap-net-1g "${EXP[@]}" experiments.overlap \
            --hosts n1,n2 --ranks 2 "${local_flags[@]}"
        on_nodes 4 10gbit run overlap-net-10g "${EXP[@]}" experiments.overlap \
            --hosts n1,n2,n3,n4 --ranks 2 4 "${local_flags[@]}"
        on_nodes 2 10gbit run overlap-net-10g-2x2 "${EXP[@]}" experiments.overlap \
            --hosts n1,n2 --ranks 4 "${local_flags[@]}"
        page overlap overlap-fcx
        page --section "$NET" overlap-net-1g overlap-net-10g overlap-net-10g-2x2
        ;;
    sparcml)
        # The default (benchmark at 2 and 4 ranks on the emulated 10 Gb/s link,
        # cnn_small at 3 seeds): about 6 min. The communication-bound comparison
        # on P1B2 at 10 and 1 Gb/s, 3 seeds paired: about 15 min. The section:
        # the benchmark and P1B2 on 4 nodes and 2 nodes at 1 Gb/s and 2 nodes at
        # 10 Gb/s, 3 seeds each: about 12, 8 and 6 min.
        run sparcml "${EXP[@]}" experiments.sparcml --no-progress
        run sparcml-cb "${EXP[@]}" experiments.sparcml --skip-bench --arms \
            --comm-bound --cb-models candle_p1b2 --cb-links 10gbps 1gbps \
            --cb-steps 50 --cb-seeds 0 1 2 --no-progress --no-plots
        net=(--bench-link real --arms --comm-bound --cb-models candle_p1b2
            --cb-links real --cb-steps 50 --cb-seeds 0 1 2 --no-progress)
        on_nodes 4 1gbit run sparcml-cb-net-1g "${EXP[@]}" experiments.sparcml \
            --hosts n1,n2,n3,n4 --np 4 "${net[@]}"
        on_nodes 2 1gbit run sparcml-cb-net-1g-2n "${EXP[@]}" experiments.sparcml \
            --hosts n1,n2 --np 2 "${net[@]}"
        on_nodes 2 10gbit run sparcml-cb-net-10g-2n "${EXP[@]}" experiments.sparcml \
            --hosts n1,n2 --np 2 "${net[@]}"
        page sparcml sparcml-cb
        page --section "$NET" sparcml-cb-net-1g sparcml-cb-net-1g-2n sparcml-cb-net-10g-2n
        ;;
    scalability)
        # The default (22 steps a configuration, 20 measured): about 15 min. The
        # section: NT3 on 2 nodes at 1 Gb/s, ranks, straggler and checkpoint
        # sweeps, the straggler on the real link: about 6 min.
        run scalability "${EXP[@]}" experiments.scalability
        on_nodes 2 1gbit run scalability-net "${EXP[@]}" experiments.scalability \
            --sweeps ranks straggler checkpoint --models nt3 --hosts n1,n2 \
            --ranks 1 2 4 --straggler-link real
        page scalability
        page --section "$NET" scalability-net
        ;;
    adaptive)
        # Each scenario makes its own cluster (4 nodes, the link set by step),
        # 2 and 4 ranks, seeds 3-5 (the model was tuned on 0-2): about 30 min each.
        run adaptive-mixed "${EXP[@]}" experiments.adaptive --cluster "$CLUSTER" \
            --no-progress
        run adaptive-link-drop "${EXP[@]}" experiments.adaptive --cluster "$CLUSTER" \
            --scenario link-drop --no-progress
        page adaptive-mixed adaptive-link-drop
        ;;
    network)
        # The link model against TCP: the sweep (1 and 10 Gb/s, 2 and 4 nodes;
        # its own cluster), twice, the second the check of the first: about 5
        # min each.
        run network-a "${EXP[@]}" scripts.bench_link --sweep --cluster "$CLUSTER" --reps 7
        run network-b "${EXP[@]}" scripts.bench_link --sweep --cluster "$CLUSTER" --reps 7
        page network-a network-b
        ;;
    *)
        echo "scripts/regenerate_results.sh: no page $p (pages: ${PAGES[*]})" >&2
        exit 2
        ;;
    esac
done

# Every page made again: nothing may be left unchecked. Some: the others may
# still predate their data.
strict=()
[ $# -eq 0 ] && strict=(--strict)
"$PY" -m scripts.results --check "${strict[@]}" --root "$ROOT"
say "done: the pages in $ROOT/docs/results, the runs in $RUNS"
