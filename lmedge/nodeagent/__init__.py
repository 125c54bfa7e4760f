"""The node agent: one per worker node, deciding and actuating for that node only.

Owns the agent's slot (`agent`: observe its own node, run its deployer
through the controller's decision guard, start and stop its model pods,
tell its gateway which pods serve here) and the node's telemetry
(`telemetry`: exporters or Prometheus, as `NodeTelemetry`, plus its token
engines' `/metrics`, parsed in `engines`).

Not here: the deployer itself (a plugin of `lmedge.policies` or
`lmedge.agents`), the rules a decision must pass (`lmedge.controller.guard`,
shared with the controller), the Kubernetes and gateway clients
(`lmedge.backends.kubernetes`), and the process around the agent (assembled
in `lmedge.processes`).
"""
