"""Two network namespaces joined by a veth pair: the edge host and the centre host.

Everything the benchmark starts runs inside them, so its traffic never leaves the machine and its
ports cannot collide with anyone else's. `namespace_pair()` removes what it made (the processes
still inside, the namespaces and with them the veth pair) however the block ends; a run killed
with SIGKILL is swept up by the next one (`sweep_stale`).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Iterator

PREFIX = "edgellm-split-"
STALE = re.compile(rf"^{re.escape(PREFIX)}(?P<pid>\d+)-(edge|centre)$")


@dataclass(frozen=True)
class NamespacePair:
    edge: str
    centre: str
    edge_address: str = "10.77.0.1"
    centre_address: str = "10.77.0.2"

    def command(self, namespace: str, argv: list[str]) -> list[str]:
        """`argv` run inside `namespace` (`ip netns exec` execs it: the pid is the command's)."""
        return ["ip", "netns", "exec", namespace, *argv]


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def names_for(pid: int) -> tuple[str, str, str, str]:
    """Namespace names and veth names (at most 15 characters) for the run with this pid."""
    return f"{PREFIX}{pid}-edge", f"{PREFIX}{pid}-centre", f"els{pid}e"[:15], f"els{pid}c"[:15]


@contextlib.contextmanager
def namespace_pair(rate_mbit: float | None = None) -> Iterator[NamespacePair]:
    """Create the pair (10.77.0.1/30 at the edge, 10.77.0.2/30 at the centre), optionally with a
    `tbf` bandwidth cap on both veth ends; yield it; remove it."""
    sweep_stale()
    edge, centre, veth_edge, veth_centre = names_for(os.getpid())
    pair = NamespacePair(edge, centre)
    created: list[str] = []
    try:
        for namespace in (edge, centre):
            ip("netns", "add", namespace)
            created.append(namespace)
        # Created inside the namespaces directly, so nothing is ever left in the host's.
        ip("link", "add", veth_edge, "netns", edge, "type", "veth", "peer", "name", veth_centre, "netns", centre)
        for namespace, device, address in ((edge, veth_edge, pair.edge_address), (centre, veth_centre, pair.centre_address)):
            ip("-n", namespace, "addr", "add", f"{address}/30", "dev", device)
            ip("-n", namespace, "link", "set", device, "up")
            ip("-n", namespace, "link", "set", "lo", "up")
            if rate_mbit:
                subprocess.run(pair.command(namespace, ["tc", "qdisc", "add", "dev", device, "root", "tbf",
                                                        "rate", f"{rate_mbit}mbit", "burst", "64kb", "latency", "400ms"]),
                               check=True, capture_output=True, text=True)
        yield pair
    finally:
        for namespace in reversed(created):
            remove_namespace(namespace)


def remove_namespace(namespace: str) -> None:
    """Stop the processes still inside `namespace` (all started by this benchmark), then delete it."""
    kill_inside(namespace, signal.SIGTERM)
    deadline = time.monotonic() + 5
    while pids_inside(namespace) and time.monotonic() < deadline:
        time.sleep(0.1)
    kill_inside(namespace, signal.SIGKILL)
    ip("netns", "del", namespace, check=False)


def pids_inside(namespace: str) -> list[int]:
    result = ip("netns", "pids", namespace, check=False)
    return [int(p) for p in result.stdout.split()] if result.returncode == 0 else []


def kill_inside(namespace: str, sig: signal.Signals) -> None:
    for pid in pids_inside(namespace):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def sweep_stale() -> None:
    """Remove namespaces left by an earlier run whose process is gone (it was SIGKILLed)."""
    listing = ip("netns", "list", check=False).stdout
    for line in listing.splitlines():
        name = line.split()[0] if line.split() else ""
        match = STALE.match(name)
        if match and not pid_alive(int(match["pid"])):
            remove_namespace(name)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
