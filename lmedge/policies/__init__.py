"""The deterministic policy plugins: planners, routers and deployers.

One folder per plugin (random, uniform, local, full, lyapunov, perllm,
milp, cema, lyreo), each with its code and a README giving its formula,
inputs and parameters. Plugins are pure: they take an observation and
return a `Decision` (`lmedge.api`), with no I/O and no wall clock, so the
same objects run in the emulator and on a cluster. Plugins are siblings: a
plugin does not import another (an independence contract in
`.importlinter`); helpers several of them share live in the policy kit
(`lmedge.policies.kit`), and numba compiles in `compiled` only. Which modes
an LM can run in on a node is not a policy's to say: it is
`ClusterContext.modes` (`lmedge.api.hosting`).

Not here: the LLM agents (`lmedge.agents`), the registry that names the
plugins and the profiles that compose them (`lmedge.controller.catalog`,
filled by `lmedge.controller.registrations`), and the guard that checks a
decision before it reaches the cluster (`lmedge.controller.guard`).
"""
