"""The Kubernetes operator for `EdgeNode` and `LMService`.

Owns the kopf handlers (`handlers`: validate the spec, call a plain
function, return status), the decisions they take as plain functions
(`logic`), the NVIDIA time-slicing configuration rendered from EdgeNodes
(`timeslicing`), the process's one API client (`kube`) and the chart's
pre-delete hook (`uninstall`).

Not here: the control loop and its plugins (`lmedge.controller`,
`lmedge.policies`), the Kubernetes client itself
(`lmedge.backends.kubernetes.client`), and the assembly of the controller
process that runs this operator beside the loop (`lmedge.processes`).
"""
