#!/usr/bin/env bash
# A one-node Slurm on this machine, for running the batch templates for real.
#
#   bash scripts/cluster/slurm_localhost.sh start   # munged, slurmctld, slurmd
#   bash scripts/cluster/slurm_localhost.sh stop    # them all (munged if it started it)
#
# Needs Debian's slurm-wlm and munge (`make test-cluster` installs them where it
# can). Everything lives in $SLURM_LOCAL_DIR (default /tmp/research-slurm-$UID):
# the configuration, spool and state, and the daemons' logs. That folder is
# created 0700 and must be ours and writable by nobody else (research/privdir.py:
# a slurm.conf someone else could edit names programs the daemons run as root).
# Exits 3 with one line when Slurm cannot start here (no packages, not root, no
# munge key, a refused folder).
set -euo pipefail
DIR="${SLURM_LOCAL_DIR:-/tmp/research-slurm-$(id -u)}"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="${PYTHON:-$REPO/.venv/bin/python}"
[ -x "$PY" ] || PY=python3
CONF="$DIR/slurm.conf"
NODE="$(hostname -s)"

cannot() { echo "slurm_localhost: cannot start Slurm here: $*" >&2; exit 3; }

start() {
  for exe in slurmctld slurmd munged sbatch; do
    command -v "$exe" >/dev/null || [ -x "/usr/sbin/$exe" ] ||
      cannot "$exe not found (apt-get install slurm-wlm munge)"
  done
  [ "$(id -u)" = 0 ] || cannot "the daemons need root"
  why="$(PYTHONPATH="$REPO" "$PY" -m research.privdir "$DIR" 2>&1)" ||
    cannot "${why#privdir: }"
  mkdir -p "$DIR/spool" "$DIR/state" "$DIR/log"
  cpus="$(nproc)"
  mem="$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)"
  cat >"$CONF" <<CONF
ClusterName=research-local
SlurmctldHost=$NODE
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
NodeName=$NODE CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=local Nodes=$NODE Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
  if ! pgrep -r R,S,D -x munged >/dev/null; then  # zombies do not count
    [ -r /etc/munge/munge.key ] || cannot "no /etc/munge/munge.key"
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown -R munge:munge /run/munge /var/log/munge /var/lib/munge /etc/munge 2>/dev/null || true
    if id munge >/dev/null 2>&1; then
      su -s /bin/sh munge -c "/usr/sbin/munged" || /usr/sbin/munged --force
    else
      /usr/sbin/munged --force
    fi
    # Ours to stop: `stop` ends the munged this script started, not one that
    # was running already (a node's own).
    pgrep -r R,S,D -x munged >"$DIR/munged.pid" || true
  fi
  stop_daemons
  /usr/sbin/slurmctld -f "$CONF"
  /usr/sbin/slurmd -f "$CONF"
  for _ in $(seq 1 60); do
    state="$(SLURM_CONF="$CONF" sinfo -h -o %T 2>/dev/null || true)"
    case "$state" in idle*|mixed*|allocated*) echo "$CONF"; return 0 ;; esac
    sleep 0.5
  done
  cannot "the node did not come up (state '${state:-none}'; see $DIR/log)"
}

stop_daemons() {
  [ -d "$DIR" ] || return 0
  # Pid files someone else could write would name the processes to kill.
  why="$(PYTHONPATH="$REPO" "$PY" -m research.privdir "$DIR" 2>&1)" ||
    { echo "slurm_localhost: not stopping: ${why#privdir: }" >&2; exit 3; }
  for pidfile in "$DIR/slurmd.pid" "$DIR/slurmctld.pid"; do
    if [ -f "$pidfile" ]; then
      kill "$(cat "$pidfile")" 2>/dev/null || true
      rm -f "$pidfile"
    fi
  done
  # The pid files do not always name every daemon (slurmctld forks a helper),
  # and a job still running when the daemons stop (a requeued one, say) leaves
  # its slurmstepd, batch script and srun behind, re-parented to init: end
  # every process of a job of this Slurm (SLURM_JOB_ID with our SLURM_CONF in
  # its environment; slurmstepd has the configuration only), then the daemons.
  for env in /proc/[0-9]*/environ; do
    pid="${env#/proc/}"; pid="${pid%/environ}"
    [ "$pid" = "$$" ] && continue
    if grep -qz "^SLURM_CONF=$CONF\$" "$env" 2>/dev/null &&
       { grep -qz "^SLURM_JOB_ID=" "$env" 2>/dev/null ||
         [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = slurmstepd ]; }; then
      kill -9 "$pid" 2>/dev/null || true
    fi
  done
  pkill -f -- "-f $CONF" 2>/dev/null || true
  sleep 1
  pkill -9 -f -- "-f $CONF" 2>/dev/null || true
}

stop_munge() {
  [ -f "$DIR/munged.pid" ] || return 0
  pids="$(cat "$DIR/munged.pid")"
  kill $pids 2>/dev/null || true
  # Gone before returning: a start right after must not find it still exiting
  # (it would not start its own, and the node would never come up).
  for _ in $(seq 1 50); do
    alive=""
    for pid in $pids; do
      [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = munged ] &&
        ! grep -q '^State:.*Z' "/proc/$pid/status" 2>/dev/null && alive=1
    done
    [ -z "$alive" ] && break
    sleep 0.1
  done
  rm -f "$DIR/munged.pid"
}

case "${1:-}" in
  start) start ;;
  stop) stop_daemons; stop_munge ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
