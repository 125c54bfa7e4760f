"""The composition roots: each lmedge process is assembled in one module here.

| module | process |
|---|---|
| `controller.py` | `lmedge controller`: leader election, the kopf operator, the control loop |
| `node_agent.py` | `lmedge node-agent`: one node's deployer and actuation, following the run |
| `gateway.py` | `lmedge gateway`: one node's data plane (user API, forwarding, queues) |
| `dashboard.py` | `lmedge dashboard`: the web dashboard over a store |
| `plugins.py` | `register_plugins()`: fills the plugin catalog (every root building a policy) |

A root connects the clients, opens the store, builds the objects and runs
them; the CLI (`lmedge.cli`) only parses flags into the arguments of one
root function per command. Nothing below this package fills the plugin
catalog: a process that builds plugins calls `register_plugins()` first.
"""

from __future__ import annotations

import logging
import signal
import threading

__all__ = ["configure_logging", "stop_on_signals"]


def configure_logging() -> None:
    """INFO lines with a timestamp on stderr: what a long-running process logs in a pod."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")


def stop_on_signals() -> threading.Event:
    """An event set by SIGTERM (a pod's stop) or SIGINT (Ctrl-C): the process's stop flag."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop
