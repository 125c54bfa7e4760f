"""The policy kit: what several policy plugins share, owned by none of them.

- `support`: nearest feasible nodes, role-set fit, `off`, weights summing to
  one, `no_params`;
- `params`: `PluginParams` and `parse_params`, a plugin's parameters
  validated when its profile is loaded;
- `estimates`: profile-based delay estimates (service time, serving mode,
  transfer time, link tables) of the model-based routers.

A plugin folder imports the kit and `lmedge.api`, never another plugin (the
independence contract in `.importlinter`). Which modes an LM can run in is
not here: it is `ClusterContext.modes` (`lmedge.api.hosting`), the one rule
the agents, the guard and the emulator share too.
"""
