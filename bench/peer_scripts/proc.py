"""CPU time read from /proc (standard library only: imported by ``bench.peers`` in the
think-jobs virtualenv and by ``harness`` in the peers' virtualenvs)."""

from __future__ import annotations

import os


def postgres_cpu_s() -> float:
    """CPU time (user + system) of every ``postgres`` process on this machine so far, with
    the backends that have exited: the database's share of the work (the server runs here,
    nothing else uses it meanwhile)."""
    total = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as stat:
                head, _, rest = stat.read().rpartition(")")
        except OSError:
            continue
        if head.endswith("(postgres"):
            fields = rest.split()
            # utime + stime, and cutime + cstime: the postmaster's reaped backends (a
            # connection closed meanwhile still counts)
            total += sum(int(value) for value in fields[11:15])
    return total / os.sysconf("SC_CLK_TCK")
