"""Feasibility of decisions against the cluster (docs/design.md "Interfaces", paper §III).

Each `check_*` returns *every* violation, each a sentence a person (or an LLM
asked to retry) understands; an empty list means feasible. Shape errors are
pydantic's job; these are the cross-object rules:

- macro policy: weights >= 0 summing to 1 over the LM's feasible nodes, each
  node at most once per LM, no weight on a node that cannot host the LM
  (GPU-only LMs on GPU nodes only), role sets that fit the node's capacity;
- routing map: a destination for every (origin, LM or request class) pair
  with arrivals, on a worker that can host the serving LM (`Route.model`,
  which must serve the class; required when the class is not an LM name),
  unless the pair is rejected (admission control); a pair is never both;
- placement: modes the LM can run in on the node (`lmedge.api.hosting`), at
  least the LM's `minCpuCores` for a running LM (a pod's CPU is never rounded
  down to nothing), and per-node sums sum G_ni <= G_n, sum C_ni <= C_n,
  sum M_i <= M_n, sum V_i^min <= V_n.

Memory is checked with the *deployment* memory (what a pod requests on the
cluster), not the paper's minimum: a placement that passes here is one the
Kubernetes scheduler will also admit.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from lmedge.api.decisions import LMPlacement, MacroPolicy, Placement, RoutingMap
from lmedge.api.hosting import modes, refusal
from lmedge.api.observations import Arrival, ClusterContext, NodeInfo, ServiceInfo

SUM_TOLERANCE = 1e-3


@dataclass(frozen=True)
class Violation:
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


def check_macro_policy(policy: MacroPolicy, ctx: ClusterContext) -> list[Violation]:
    out: list[Violation] = []
    seen_lms: set[str] = set()
    for i, r in enumerate(policy.routing):
        path = f"routing[{i}]"
        if not ctx.has_service(r.lm):
            out.append(Violation(path, f"unknown LM {r.lm!r}; known: {', '.join(ctx.lm_names)}"))
            continue
        if r.lm in seen_lms:
            out.append(Violation(path, f"LM {r.lm!r} appears more than once"))
        seen_lms.add(r.lm)
        feasible = set(ctx.feasible_nodes(r.lm))
        total = 0.0
        first: dict[str, int] = {}
        for j, w in enumerate(r.weights):
            wpath = f"{path}.weights[{j}]"
            if w.node in first:
                # `weights()` keeps only the last entry per node, so a repeat would
                # silently change the split the sum check below approved.
                out.append(
                    Violation(
                        wpath,
                        f"node {w.node!r} is weighted twice (first at weights[{first[w.node]}])",
                    )
                )
            first.setdefault(w.node, j)
            if not ctx.has_node(w.node):
                out.append(Violation(wpath, f"unknown node {w.node!r}"))
            elif w.node not in feasible and w.p > 0:
                out.append(Violation(wpath, _why_not_host(ctx, w.node, r.lm)))
            total += w.p
        if abs(total - 1.0) > SUM_TOLERANCE:
            out.append(Violation(path, f"weights of {r.lm!r} sum to {total:.4f}, not 1"))
    for lm in ctx.lm_names:
        if lm not in seen_lms and ctx.feasible_nodes(lm):
            out.append(Violation("routing", f"no routing weights for LM {lm!r}"))
    for i, role in enumerate(policy.roles):
        path = f"roles[{i}]"
        if not ctx.has_node(role.node):
            out.append(Violation(path, f"unknown node {role.node!r}"))
            continue
        unknown = [lm for lm in role.lms if not ctx.has_service(lm)]
        out.extend(Violation(path, f"unknown LM {lm!r}") for lm in unknown)
        lms = [lm for lm in role.lms if ctx.has_service(lm)]
        for lm in lms:
            if not ctx.can_host(role.node, lm):
                out.append(Violation(path, _why_not_host(ctx, role.node, lm)))
        hostable = [lm for lm in lms if ctx.can_host(role.node, lm)]
        out.extend(_role_capacity(ctx, role.node, hostable, path))
        for lm, mode in role.modes.items():
            if lm not in role.lms:
                out.append(Violation(f"{path}.modes", f"{lm!r} has a mode but is not in lms"))
            elif lm in hostable and mode not in ctx.modes(role.node, lm):
                out.append(
                    Violation(f"{path}.modes", f"{lm} cannot run in {mode} mode on {role.node}")
                )
    return out


def _role_capacity(ctx: ClusterContext, node: str, lms: list[str], path: str) -> list[Violation]:
    """A role set must fit concurrently: memory, and vRAM/vGPUs for GPU-only LMs."""
    spec = ctx.node(node).spec
    mem = sum(ctx.service(lm).spec.deployment_memory_gib for lm in lms)
    out: list[Violation] = []
    if mem > spec.memory_gib + 1e-9:
        out.append(
            Violation(
                path,
                f"LMs {', '.join(lms)} need {mem:g} GiB together; {node} has {spec.memory_gib:g}",
            )
        )
    gpu_only = [lm for lm in lms if ctx.service(lm).spec.runs_on == "gpu-only"]
    if len(gpu_only) > spec.total_vgpus:
        out.append(
            Violation(
                path,
                f"{len(gpu_only)} GPU-only LMs but {node} has {spec.total_vgpus} vGPUs",
            )
        )
    return out


def _why_not_host(ctx: ClusterContext, node: str, lm: str) -> str:
    n, s = ctx.node(node).spec, ctx.service(lm).spec
    if n.role != "worker":
        return f"{node} is a control node and hosts no LMs"
    if s.runs_on == "gpu-only" and not n.has_gpu:
        return f"{lm} runs on GPU only and {node} has no GPU"
    if s.deployment_memory_gib > n.memory_gib:
        return f"{lm} needs {s.deployment_memory_gib:g} GiB memory; {node} has {n.memory_gib:g}"
    return f"{lm} does not fit on {node}"


def check_routing_map(
    routing: RoutingMap,
    ctx: ClusterContext,
    arrivals: Sequence[Arrival],
    *,
    allow_rejections: bool = True,
) -> list[Violation]:
    """Every route names a known origin, a request class, a model serving it and a host.

    `lm` is an LM name or a request class (`ctx.request_classes`); the serving
    LM is `model`, or `lm` itself when `model` is null, and it must serve the
    class. The destination must be able to host the serving LM. A rejection
    names a known origin and request class that no route also covers; with
    `allow_rejections=False` (a router whose admission control is off) any
    rejection is a violation. A pair with arrivals is routed or rejected.
    """
    out: list[Violation] = []
    rejected = _check_rejections(routing, ctx, allow_rejections, out)
    seen = _plain_routes(routing, ctx, rejected)
    if seen is None:
        seen = {}
        for i, r in enumerate(routing.routes):
            key = (r.origin, r.lm)
            path = f"routes[{i}]"
            if key in seen:
                out.append(Violation(path, f"({r.origin}, {r.lm}) is routed twice"))
            if key in rejected:
                out.append(Violation(path, f"({r.origin}, {r.lm}) is both routed and rejected"))
            seen[key] = i
            if not ctx.has_node(r.origin):
                out.append(Violation(path, f"unknown origin node {r.origin!r}"))
            model = _route_model(ctx, r.lm, r.model, path, out)
            if model is None:
                continue
            if not ctx.has_node(r.destination):
                out.append(Violation(path, f"unknown destination node {r.destination!r}"))
            elif not ctx.can_host(r.destination, model):
                out.append(Violation(path, _why_not_host(ctx, r.destination, model)))
    unrouted = [a for a in arrivals if a.requests > 0 and (a.origin, a.lm) not in seen]
    for a in unrouted:
        if (a.origin, a.lm) not in rejected and _servable(ctx, a.lm):
            out.append(Violation("routes", f"no destination for ({a.origin}, {a.lm})"))
    return out


def _plain_routes(
    routing: RoutingMap, ctx: ClusterContext, rejected: set[tuple[str, str]]
) -> dict[tuple[str, str], int] | None:
    """The routed pairs (each to its route's index), or None unless every route is plain.

    A plain route names a known origin and an LM itself (no `model`) on a
    node that can host it, a pair routed once and not rejected: nothing to
    report. Most maps are all plain (~100,000 routes a slot at 10,000
    workers), and that is settled on set lookups alone; anything else takes
    `check_routing_map`'s full pass, which says what is wrong.
    """
    routes = routing.routes
    seen = {(r.origin, r.lm): i for i, r in enumerate(routes)}
    if len(seen) < len(routes) or not rejected.isdisjoint(seen):
        return None
    hosts = _hosts(ctx)
    nodes = ctx._nodes
    for r in routes:
        if r.model is not None or r.destination not in hosts.get(r.lm, ()) or r.origin not in nodes:
            return None
    return seen


def _hosts(ctx: ClusterContext) -> dict[str, frozenset[str]]:
    """Each LM's feasible nodes as a set, kept with the context (it depends on nothing else)."""
    hosts: dict[str, frozenset[str]] | None = ctx.memo.get("feasibility.hosts")
    if hosts is None:
        hosts = {lm: frozenset(ctx.feasible_nodes(lm)) for lm in ctx.lm_names}
        ctx.memo["feasibility.hosts"] = hosts
    return hosts


def _check_rejections(
    routing: RoutingMap, ctx: ClusterContext, allowed: bool, out: list[Violation]
) -> set[tuple[str, str]]:
    """The rejected pairs, after appending what is wrong with the rejection list."""
    rejected: set[tuple[str, str]] = set()
    # A valid rejection passes on set lookups alone (~10,000 a slot at 1,000 nodes);
    # the messages are built only for what is wrong.
    nodes, classes = ctx._nodes, ctx._models
    for i, r in enumerate(routing.rejections):
        key = (r.origin, r.lm)
        if allowed and key not in rejected and r.origin in nodes and r.lm in classes:
            rejected.add(key)
            continue
        path = f"rejections[{i}]"
        if not allowed:
            out.append(
                Violation(
                    path, f"admission control is off: route ({r.origin}, {r.lm}), do not reject it"
                )
            )
        if key in rejected:
            out.append(Violation(path, f"({r.origin}, {r.lm}) is rejected twice"))
        if not ctx.has_node(r.origin):
            out.append(Violation(path, f"unknown origin node {r.origin!r}"))
        if not ctx.is_request_class(r.lm):
            known = ", ".join(ctx.request_classes)
            out.append(Violation(path, f"unknown LM {r.lm!r}; LMs and request classes: {known}"))
        rejected.add(key)
    return rejected


def _route_model(
    ctx: ClusterContext, lm: str, model: str | None, path: str, out: list[Violation]
) -> str | None:
    """The LM serving a route, or None after appending why the route names none."""
    if not ctx.is_request_class(lm):
        known = ", ".join(ctx.request_classes)
        out.append(Violation(path, f"unknown LM {lm!r}; LMs and request classes: {known}"))
        return None
    if model is None:
        if ctx.has_service(lm):
            return lm
        models = ", ".join(ctx.models_for(lm))
        out.append(
            Violation(path, f"request class {lm!r} needs a model that serves it, one of: {models}")
        )
        return None
    if not ctx.has_service(model):
        out.append(Violation(path, f"unknown model {model!r}; known: {', '.join(ctx.lm_names)}"))
        return None
    if model not in ctx.models_for(lm):
        models = ", ".join(ctx.models_for(lm))
        out.append(
            Violation(path, f"model {model!r} does not serve {lm!r}; models that do: {models}")
        )
        return None
    return model


def _servable(ctx: ClusterContext, request_class: str) -> bool:
    if ctx.has_service(request_class):
        return bool(ctx.feasible_nodes(request_class))
    return any(ctx.feasible_nodes(m) for m in ctx.models_for(request_class))


def check_placement(
    placement: Placement, node: NodeInfo, services: Iterable[ServiceInfo]
) -> list[Violation]:
    svc = {s.name: s for s in services}
    spec = node.spec
    out: list[Violation] = []
    if placement.node != node.name:
        out.append(Violation("node", f"placement is for {placement.node!r}, not {node.name!r}"))
    if spec.role != "worker" and placement.active():
        out.append(Violation("lms", f"{node.name} is a control node and hosts no LMs"))
    seen: set[str] = set()
    for i, p in enumerate(placement.lms):
        path = f"lms[{i}]"
        if p.lm in seen:
            out.append(Violation(path, f"{p.lm!r} placed twice"))
        seen.add(p.lm)
        if p.lm not in svc:
            out.append(Violation(path, f"unknown LM {p.lm!r}"))
            continue
        out.extend(Violation(path, m) for m in _lm_rules(p, svc[p.lm], node))
    active = [p for p in placement.lms if p.mode != "off" and p.lm in svc]
    cpu = sum(p.cpu_cores for p in active)
    vgpus = sum(p.vgpus for p in active)
    mem = sum(svc[p.lm].spec.deployment_memory_gib for p in active)
    vram = sum(svc[p.lm].spec.min_vram_gib for p in active if p.mode == "gpu")
    for what, used, cap, unit in (
        ("CPU cores", cpu, spec.cpu_cores, ""),
        ("memory", mem, spec.memory_gib, " GiB"),
        ("vGPUs", float(vgpus), float(spec.total_vgpus), ""),
        ("vRAM", vram, spec.total_vram_gib, " GiB"),
    ):
        if used > cap + 1e-9:
            out.append(Violation("lms", f"{what}: {used:g}{unit} placed, {node.name} has {cap:g}"))
    return out


def _lm_rules(p: LMPlacement, s: ServiceInfo, node: NodeInfo) -> list[str]:
    out: list[str] = []
    if p.mode == "off":
        if p.cpu_cores or p.vgpus:
            out.append(f"{p.lm} is off but holds {p.cpu_cores:g} cores / {p.vgpus} vGPUs")
        return out
    if p.cpu_cores <= 0:
        out.append(f"{p.lm} is {p.mode} with no CPU cores")
    elif p.cpu_cores < s.spec.min_cpu_cores:
        out.append(
            f"{p.lm} needs at least {s.spec.min_cpu_cores:g} CPU cores (minCpuCores), "
            f"not {p.cpu_cores:g}"
        )
    # room is judged by the node's sums below, and a control node once for the placement
    why = refusal(node, s, p.mode, room=False) if node.spec.role == "worker" else ""
    if why:
        out.append(why)
    if p.mode == "cpu":
        if p.vgpus:
            out.append(f"{p.lm} in cpu mode must hold 0 vGPUs, not {p.vgpus}")
    else:
        if p.vgpus < 1:
            out.append(f"{p.lm} in gpu mode needs at least 1 vGPU")
        if p.vgpus > s.spec.max_vgpus:
            out.append(f"{p.lm} may take at most {s.spec.max_vgpus} vGPUs, not {p.vgpus}")
    return out


def nearest_feasible(
    placement: Placement,
    node: NodeInfo,
    services: Sequence[ServiceInfo],
    priority: dict[str, float] | None = None,
) -> Placement:
    """Map a placement to the closest feasible one in the node's action space.

    Per LM: a mode the LM cannot run in there (`lmedge.api.hosting.modes`)
    becomes its fastest open mode, else off; clamp vGPUs to [1, max] and cores
    to [default-ish, node]; then, while the node's sums are exceeded, shrink
    vGPUs and finally switch off the lowest-`priority` LMs (ties: later in the
    list first). Unknown LMs are dropped; missing LMs are added as off.
    """
    svc = {s.name: s for s in services}
    spec = node.spec
    prio = priority or {}
    fixed: dict[str, LMPlacement] = {}
    for p in placement.lms:
        if p.lm not in svc or p.lm in fixed:
            continue
        fixed[p.lm] = _fix_one(p, svc[p.lm], node)
    for name in svc:
        fixed.setdefault(name, LMPlacement(lm=name, mode="off", cpu_cores=0, vgpus=0))
    if spec.role != "worker":
        fixed = {k: _off(k) for k in fixed}
    order = sorted(
        (p for p in fixed.values() if p.mode != "off"),
        key=lambda p: (prio.get(p.lm, 0.0), -list(fixed).index(p.lm)),
    )
    result = Placement(node=node.name, lms=[fixed[k] for k in svc])
    victims: list[LMPlacement] = []
    while check_placement(result, node, services):
        shrinkable = [p for p in order if p.mode == "gpu" and fixed[p.lm].vgpus > 1]
        if shrinkable and _sum_vgpus(fixed) > spec.total_vgpus:
            lm = shrinkable[0].lm
            fixed[lm] = fixed[lm].model_copy(update={"vgpus": fixed[lm].vgpus - 1})
        elif order:
            victim = order.pop(0)
            victims.append(fixed[victim.lm])
            fixed[victim.lm] = _off(victim.lm)
        else:
            break
        result = Placement(node=node.name, lms=[fixed[k] for k in svc])
    # Switching off a large LM may have freed room for a smaller one switched
    # off before it: give the victims back, highest priority first, if they fit.
    for p in reversed(victims):
        trial = dict(fixed)
        trial[p.lm] = p
        candidate = Placement(node=node.name, lms=[trial[k] for k in svc])
        if not check_placement(candidate, node, services):
            fixed, result = trial, candidate
    return result


def _off(lm: str) -> LMPlacement:
    return LMPlacement(lm=lm, mode="off", cpu_cores=0, vgpus=0)


def _sum_vgpus(fixed: dict[str, LMPlacement]) -> int:
    return sum(p.vgpus for p in fixed.values() if p.mode == "gpu")


def _fix_one(p: LMPlacement, s: ServiceInfo, node: NodeInfo) -> LMPlacement:
    spec = node.spec
    mode = p.mode
    if mode != "off" and mode not in (open_ := modes(spec, s.spec)):
        mode = open_[0] if open_ else "off"
    if mode == "off":
        return _off(p.lm)
    cores = p.cpu_cores if p.cpu_cores > 0 else s.spec.default_cpu_cores
    cores = min(max(cores, s.spec.min_cpu_cores), spec.cpu_cores)
    vgpus = 0
    if mode == "gpu":
        vgpus = min(max(p.vgpus, 1), s.spec.max_vgpus, spec.total_vgpus)
    return LMPlacement(lm=p.lm, mode=mode, cpu_cores=cores, vgpus=vgpus)
