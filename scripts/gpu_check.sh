#!/usr/bin/env bash
# The project on a lent GPU machine (no network), in one call of about 8 minutes:
# install from the wheels carried in .whl/ (made beforehand, where there is
# network, by scripts/gpu_wheels.sh), then python -m scripts.gpu_check, whose run
# folder docs/results/gpu.md is rendered from. Results go to $OUT (the device
# tool brings that folder back), else runs/:
#
#   bash scripts/gpu_check.sh [gpu_check's options, e.g. --stages models,strategies]
#   GPU_CHECK_S=SECONDS (default 520): the whole, install included
#   RESEARCH_COMMIT=SHA: the code's commit, as `git rev-parse --short=12 HEAD` says
#     it here (the device tool's copy of the tree carries an earlier commit's git)
#
# What the H200 runs of 2026-11-28 left to do (adaptive at 1 rank, VGG-16), then
# what staging through host costs and the staged ring (allreduce=ring on GPU
# arrays) at 102 MB, in one call of about 8 minutes (timeout_s 600):
#   GPU_CHECK_S=540 bash scripts/gpu_check.sh --strategies adaptive \
#     --stages strategies,stop,vgg,staging,allreduce
#
# $OUT gets: install.log, gpu-check.log, table.md, checks.json, and gpu-check.tgz
# (the run folder without checkpoints), which `tar xzf` unpacks into a folder
# that `python -m scripts.results` renders.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
OUT="${OUT:-runs}"
mkdir -p "$OUT" runs
t0=$(date +%s)
say() { echo "=== gpu_check.sh [$(( $(date +%s) - t0 )) s] $*"; }
say "machine: $(nvidia-smi -L 2>/dev/null | head -4 | tr '\n' ';') $(nproc) cores"
if [ -d .whl ]; then
  export PIP_NO_INDEX=1 PIP_FIND_LINKS="$PWD/.whl"
fi
say "install (offline from .whl: ${PIP_FIND_LINKS:-no, from the index})"
bash scripts/install.sh --cuda > "$OUT/install.log" 2>&1
rc=$?
tail -5 "$OUT/install.log"
STAGES=()
if [ $rc -ne 0 ]; then
  say "install FAILED (exit $rc): see install.log"
  # The model timings need JAX and torch only: they still come back.
  .venv/bin/python -c "import jax" 2>/dev/null || exit "$rc"
  say "running the models stage alone (it needs no mpi4jax)"
  STAGES=(--stages models)
fi
RUN=runs/gpu-check
rm -rf "$RUN"
# GPU_CHECK_S (default 520): this whole script's seconds, install included. No
# stage starts in its last 150 s, every job ends 30 s before it, and `timeout`
# stops the check 10 s before it, so that the run folder is packed either way.
LEFT=$(( ${GPU_CHECK_S:-520} - ($(date +%s) - t0) ))
say "python -m scripts.gpu_check $* ($LEFT s left)"
timeout -k 5 $(( LEFT - 10 )) .venv/bin/python -m scripts.gpu_check --out "$RUN" \
  --install-log "$OUT/install.log" --budget-s $(( LEFT - 150 )) \
  --deadline-s $(( LEFT - 30 )) "${STAGES[@]}" "$@" 2>&1 | tee "$OUT/gpu-check.log"
rc=$(( rc || PIPESTATUS[0] ))
cp "$RUN/table.md" "$RUN/checks.json" "$OUT/" 2>/dev/null
tar -czf "$OUT/gpu-check.tgz" --exclude=checkpoints --exclude='*.npz' -C runs gpu-check
say "done (exit $rc): $(du -h "$OUT/gpu-check.tgz" | cut -f1) of run folder in $OUT"
exit "$rc"
