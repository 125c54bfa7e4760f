"""The control loop and what it needs to run plugins safely.

Owns the slot/epoch loop (`loop`), the plugin catalog and its one
registration site (`catalog`, `registrations`), the assembly of a policy
profile into one run's plugins (`assembly`), the decision guard every
decision passes through, in the controller as in a node agent (`guard`),
the fallbacks when a plugin fails (`fallbacks`), and the control plane's
Prometheus metrics.

It drives a `ClusterBackend` and never knows which one: no Kubernetes
client, no SimPy, no gateway client here, and the slot clock is the
backend's (only the time a plugin takes is measured on the wall). What a
plugin decides is the plugin's (`lmedge.policies`, `lmedge.agents`); a
process that runs the loop is assembled in `lmedge.processes`.
"""
