"""`lmedge dashboard`: a web view of what the control plane stored.

Reads one store (embedded or MongoDB, read-only) and shows the runs, one run's
metrics over windows (with LYREO's token and balance figures and CEMA's
routing windows where the run measured them), the cluster (placements, queue backlogs, the macro
policy), the agents' decisions (filterable, one in full) and report folders
side by side. Server-rendered HTML with inline SVG: no script and no asset
from anywhere else, so it works offline. It sits with the other processes
(`lmedge.dataplane`, `lmedge.operator`) and imports only the store, the
metrics, the API models and the summary's tallies (`lmedge.bench`); it never
writes.
"""

from __future__ import annotations

from lmedge.dashboard.app import COOKIE, DashboardSettings, create_app

__all__ = ["COOKIE", "DashboardSettings", "create_app"]
