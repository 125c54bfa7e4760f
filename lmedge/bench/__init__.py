"""Running policies on emulated scenarios side by side, and writing reports.

`runner` performs one run (scenario, policy, seed), `summary` turns it into
the deterministic numbers, `report` and `plots` write a report folder. The
CLI commands `simulate`, `bench` and `demo` are thin wrappers around these.
"""
