"""The two worlds the control plane drives, behind one `ClusterBackend` protocol.

`emulated` runs the SimPy testbed of `lmedge.sim` in virtual time;
`kubernetes` reads and changes a real cluster. Both answer the same calls
(context, snapshot, arrivals, publish a routing map, apply a placement), so
the controller and the policies cannot tell them apart: an emulated run and
a cluster run differ only in the backend and its clock. The clients of the
outside world live here too: the one client of the Kubernetes API
(`kubernetes.client`) and the control plane's client of the node gateways
(`kubernetes.gateways`).

Not here: what to decide (`lmedge.policies`, `lmedge.agents`), the slot loop
that asks for decisions (`lmedge.controller`), and the processes that run
in a cluster (assembled in `lmedge.processes`).
"""
