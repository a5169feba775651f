"""Host lists for launchers: ``--hosts`` as ranks per host, and the local
cluster that has those hosts."""

from __future__ import annotations

import os
from pathlib import Path

from research.localnet.cluster import DIR_ENV, STATE_ROOT, Cluster, LocalnetError


def parse_hosts(spec: str, np_: int) -> list[tuple[str, int]]:
    """``"n1,n2"`` or ``"n1:2,n2:1"`` and a rank count as ``[(host, ranks)]``.

    Without counts the ranks are spread in blocks (node-contiguous ranks, the
    first ``np % hosts`` hosts one more); with counts they must add up to ``np``.
    """
    items = [s.strip() for s in spec.split(",") if s.strip()]
    if not items:
        raise ValueError("--hosts: give at least one host, e.g. n1,n2")
    names, counts = [], []
    for item in items:
        host, _, count = item.partition(":")
        if not host:
            raise ValueError(f"--hosts: empty host name in {spec!r}")
        if count:
            if not count.isdigit() or int(count) < 1:
                raise ValueError(
                    f"--hosts: bad rank count in {item!r} (want host:N, N >= 1)"
                )
            counts.append(int(count))
        names.append(host)
    if len(set(names)) != len(names):
        raise ValueError(f"--hosts: a host appears twice in {spec!r}")
    if counts and len(counts) != len(names):
        raise ValueError(
            f"--hosts: give a rank count for every host or none ({spec!r})"
        )
    if counts:
        if sum(counts) != np_:
            raise ValueError(
                f"--hosts {spec} places {sum(counts)} ranks but --np is {np_}"
            )
        return list(zip(names, counts))
    if np_ < len(names):
        raise ValueError(f"--np {np_} is fewer than the {len(names)} hosts of --hosts")
    base, extra = divmod(np_, len(names))
    return [(h, base + (i < extra)) for i, h in enumerate(names)]


def find_cluster(hosts: list[str]) -> Cluster | None:
    """The running local cluster that has every one of ``hosts``, or None.

    ``$RESEARCH_LOCALNET_DIR`` names the cluster when set (only it is looked
    at); else the one cluster under :data:`STATE_ROOT` that has all the hosts.

    Raises:
      LocalnetError: several clusters have them (set the variable to choose).
    """
    if os.environ.get(DIR_ENV):
        folder = Path(os.environ[DIR_ENV])
        try:
            cluster = Cluster.load(folder.name)
        except (LocalnetError, OSError, ValueError, TypeError):
            return None
        return cluster if set(hosts) <= set(cluster.hosts()) else None
    found = []
    for folder in sorted(STATE_ROOT.iterdir()) if STATE_ROOT.is_dir() else []:
        try:
            cluster = Cluster.load(folder.name)
        except (LocalnetError, OSError, ValueError, TypeError):
            continue
        if set(hosts) <= set(cluster.hosts()):
            found.append(cluster)
    if len(found) > 1:
        names = ", ".join(f"{DIR_ENV}={c.dir}" for c in found)
        raise LocalnetError(
            f"several local clusters have {','.join(hosts)}: choose one ({names})"
        )
    return found[0] if found else None
