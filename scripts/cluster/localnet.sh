#!/usr/bin/env bash
# Nodes on one box (network namespaces with their own hostname and /dev/shm, joined
# by shaped links): `localnet.sh up 2 --rate 1gbit`, `status`, `down`, faults.
# Everything is in research/localnet.py; `localnet.sh --help` lists the commands.
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="$REPO/.venv/bin/python"
[ -x "$PY" ] || PY=python3
PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" exec "$PY" -m research.localnet "$@"
