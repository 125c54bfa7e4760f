"""lmedge: a control plane for serving many language models on edge GPU clusters.

The import package is layered (see `.importlinter`): `api` holds the contracts;
`policies` and `agents` decide; `controller` and `sim` run the loop; `operator`,
`nodeagent`, `dataplane` and `cli` are the processes and front ends.
"""

__version__ = "0.1.0"
