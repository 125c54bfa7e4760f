"""How fast a model instance serves, given its resources and its neighbours.

Service time of one prompt = base time / rate, where the *base time* comes
from the LMService profile and the instance's own resources, and the *rate*
(<= 1) from what else is busy on the node at the same moment.

- GPU mode: base = `gpuSecondsPerPrompt` (one uncontended instance; a
  physical time, not the Lyapunov weight's 30 / alpha_gpu -- see
  `examples/testbed/services.yaml`). Time-slicing is work-conserving and weighted by
  vGPU slots: on a physical GPU g whose busy pods hold B_g slots, a busy pod
  holding s_g of them gets the share s_g / B_g. A pod spread over several
  GPUs by `device_map` runs its layers on them in turn (model parallel, not
  data parallel), so its time per prompt is the slot-weighted sum over its
  GPUs: 1 / rate = sum_g (s_g / v) / (s_g / B_g) = sum_g B_g / v, v = the
  pod's slots. Alone, a pod therefore runs at rate 1 whatever its vGPU count:
  more vGPUs buy a larger share under contention, never a speedup.
  Context-switch overhead: f(eta_gpu) with eta_gpu = B_g / slots of g when two
  or more pods are busy on g, else 0. A GPU pod's CPU cores do not change its
  speed (assumption: host-side work is not the bottleneck).
- CPU mode: base = `cpuSecondsPerPrompt` * S(defaultCpuCores) / S(c) with
  Amdahl's S(c) = 1 / ((1 - p) + p / c); rate = f(eta_cpu) * f(eta_mem) as in
  the paper's Eq. 13.

Optional GPU demands (`emulation.gpuDemand`, default 1 for every LM):
a pod that leaves the GPU partly idle when alone contends only when the
demands on a GPU add up to more than 1 (`demand_rates`); a pod spread over
several GPUs is then charged its demand on each of them (conservative).

f(eta) = 1 / (1 + beta * max(0, eta - eta0)) (see `SlowdownSpec`).

`no_queue_lower_bound` / `lower_bounds`: the latency a request could not beat
on this model -- uplink + inference + downlink on its fastest feasible node
and mode, with no queue, no cold start and no contention.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from lmedge.api.observations import ClusterContext
from lmedge.api.records import RequestRecord
from lmedge.sim.network import KIB_BITS, Network
from lmedge.sim.scenario import SlowdownSpec


def slowdown(spec: SlowdownSpec, eta: float) -> float:
    """f(eta): 1 below the knee, then 1 / (1 + beta (eta - eta0))."""
    over = eta - spec.eta0
    return 1.0 if over <= 0 else 1.0 / (1.0 + spec.beta * over)


def amdahl(cores: float, parallel_fraction: float) -> float:
    """Speedup of `cores` cores over one core."""
    return 1.0 / ((1.0 - parallel_fraction) + parallel_fraction / max(cores, 1e-9))


def cpu_base_seconds(
    seconds_at_default: float, default_cores: float, cores: float, parallel_fraction: float
) -> float:
    """Seconds per prompt on `cores` cores, given the profiled time on the default cores."""
    return (
        seconds_at_default
        * amdahl(default_cores, parallel_fraction)
        / amdahl(cores, parallel_fraction)
    )


def gpu_rate(
    binding: Sequence[tuple[int, int]],
    busy_slots: Sequence[int],
    busy_pods: Sequence[int],
    slots_per_gpu: int,
    spec: SlowdownSpec,
) -> float:
    """Rate of a busy GPU pod bound as [(gpu, slots), ...] (itself counted in busy_*)."""
    v = sum(s for _, s in binding)
    inv = 0.0
    eta = 0.0
    for g, _ in binding:
        inv += busy_slots[g] / v
        if busy_pods[g] >= 2:
            eta = max(eta, busy_slots[g] / slots_per_gpu)
    return slowdown(spec, eta) / inv


def demand_rates(weights: Sequence[float], demands: Sequence[float]) -> list[float]:
    """Speed factors (<= 1) of the busy pods on one GPU, given their GPU demands.

    A pod with demand d uses the fraction d of the GPU's time when it runs
    alone at full speed (small text models leave the GPU mostly idle). The
    GPU's time is shared by weighted max-min fairness (weights = vGPU slots):
    pods demanding less than their fair share get all they ask for, the rest
    split what remains by weight. Speed = share / demand. With every demand
    1 this is the plain slot-weighted share s / B.
    """
    n = len(weights)
    share = [0.0] * n
    open_ = list(range(n))
    left = 1.0
    while open_:
        fair = left / sum(weights[i] for i in open_)
        capped = [i for i in open_ if demands[i] <= fair * weights[i]]
        if not capped:
            for i in open_:
                share[i] = fair * weights[i]
            break
        for i in capped:
            share[i] = demands[i]
            left -= demands[i]
        open_ = [i for i in open_ if i not in capped]
    return [min(1.0, share[i] / demands[i]) for i in range(n)]


def lognormal_unit(cv: float) -> tuple[float, float]:
    """(mu, sigma) of a lognormal with mean 1 and coefficient of variation `cv`."""
    sigma2 = math.log1p(cv * cv)
    return -sigma2 / 2.0, math.sqrt(sigma2)


def fastest_seconds_per_prompt(ctx: ClusterContext, lm: str, node: str) -> float | None:
    """The least seconds per prompt `lm` can take on `node`; None if it cannot run there.

    GPU: `gpuSecondsPerPrompt` (an uncontended pod runs at rate 1 whatever its
    vGPUs, and slowdowns only slow it down). CPU: `cpuSecondsPerPrompt`
    scaled *perfectly* from `defaultCpuCores` to all the node's cores -- a
    bound for any Amdahl fraction <= 1, so it never exceeds what the emulator
    can reach.
    """
    n, s = ctx.node(node).spec, ctx.service(lm).spec
    best: float | None = None
    for mode in ctx.modes(node, lm):
        cpu_s = s.profile.cpu_seconds_per_prompt
        if mode == "cpu" and cpu_s is not None:
            # fewer cores than the default are slower than the profile, never faster
            t = cpu_s * s.default_cpu_cores / max(n.cpu_cores, s.default_cpu_cores)
        else:
            t = s.profile.gpu_seconds_per_prompt
        best = t if best is None else min(best, t)
    return best


def no_queue_lower_bound(
    ctx: ClusterContext, network: Network, lm: str, origin: str, prompts: int
) -> float | None:
    """Least end-to-end seconds of a set of `prompts` for `lm` submitted at `origin`.

    The minimum over `lm`'s feasible nodes of uplink + prompts x fastest
    seconds per prompt + downlink; None when no node can host it.
    """
    prof = ctx.service(lm).spec.profile
    best: float | None = None
    for node in ctx.feasible_nodes(lm):
        per_prompt = fastest_seconds_per_prompt(ctx, lm, node)
        if per_prompt is None:
            continue
        t = (
            network.delay(origin, node, prompts * prof.request_kib)
            + prompts * per_prompt
            + network.delay(node, origin, prompts * prof.response_kib)
        )
        best = t if best is None else min(best, t)
    return best


def lower_bounds(
    ctx: ClusterContext, records: Sequence[RequestRecord], lms: Sequence[str]
) -> dict[str, float | None]:
    """Per metric LM, the mean no-queue lower bound of the requests its mean latency averages.

    That is the successful requests (mean latency is success-only), so the
    LM's mean latency is never below its bound; an LM with no success gets
    the bound over its arrivals, and one with neither None. A record's LM may
    be a request class: its serving `model` (else the class's default model)
    is the LM bounded. Unknown LMs and origins give None. Every record is
    bounded in `ctx`; `LowerBoundTally` takes each one's own context.
    """
    tally = LowerBoundTally()
    for r in records:
        tally.add(ctx, r)
    return tally.bounds(lms)


class LowerBoundTally:
    """`lower_bounds` as requests finish, each bounded in the context in force then.

    A run's context changes (a timeline adds an LMService or a node): a
    request is bounded with the LMs, nodes and links it could have used, so
    an LM that arrives mid-run has a bound like any other. Memory: four
    numbers per LM and the bounds of the (LM, origin, prompts) keys of the
    current context.
    """

    def __init__(self) -> None:
        self._ctx: ClusterContext | None = None
        self._table: _BoundTable | None = None
        self._cache: dict[tuple[str, str, int], float | None] = {}
        # per metric LM: [successes, sum and count of their bounds, sum and count of all bounds]
        self._per_lm: dict[str, list[float]] = {}

    def add(self, ctx: ClusterContext, r: RequestRecord) -> None:
        """Bound one finished request in `ctx`, the context in force when it ran."""
        if ctx is not self._ctx:
            self._ctx, self._table, self._cache = ctx, _BoundTable(ctx), {}
        assert self._table is not None
        name = r.lm
        row = self._per_lm.get(name)
        if row is None:
            row = self._per_lm[name] = [0, 0.0, 0, 0.0, 0]
        ok = r.outcome == "success"
        row[0] += ok
        lm = r.model or (name if ctx.has_service(name) else ctx.default_model(name))
        if lm is None or not ctx.has_service(lm) or not ctx.has_node(r.origin):
            return
        key = (lm, r.origin, r.prompts)
        if key not in self._cache:
            self._cache[key] = self._table.bound(lm, r.origin, r.prompts)
        if (v := self._cache[key]) is None:
            return
        if ok:
            row[1] += v
            row[2] += 1
        row[3] += v
        row[4] += 1

    def bounds(self, lms: Sequence[str]) -> dict[str, float | None]:
        """Per LM of `lms`: the mean bound of its successes, else of its arrivals, else None."""
        out: dict[str, float | None] = {}
        for name in lms:
            row = self._per_lm.get(name)
            if row is None:
                out[name] = None
                continue
            successes, ok_sum, ok_n, all_sum, all_n = row
            total, n = (ok_sum, ok_n) if successes else (all_sum, all_n)
            out[name] = total / n if n else None
        return out


class _BoundTable:
    """`no_queue_lower_bound` over every feasible node at once, for one context.

    The same formula, term by term in the same order (so the same floats),
    with what does not depend on the request computed once: each LM's
    seconds per prompt on each node, and each origin's links to every node.
    At 1,000 workers a run meets ~50,000 (LM, origin, prompts) keys; the
    node-by-node loop took seconds of every early slot.
    """

    def __init__(self, ctx: ClusterContext) -> None:
        self.ctx = ctx
        self.network = Network(ctx.nodes)
        self._index = {n.name: i for i, n in enumerate(ctx.nodes)}
        self._nodes: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._links: dict[str, np.ndarray] = {}

    def _lm(self, lm: str) -> tuple[np.ndarray, np.ndarray]:
        """(node indices, seconds per prompt) of the nodes that can run `lm`."""
        got = self._nodes.get(lm)
        if got is None:
            idx, per = [], []
            for node in self.ctx.feasible_nodes(lm):
                t = fastest_seconds_per_prompt(self.ctx, lm, node)
                if t is not None:
                    idx.append(self._index[node])
                    per.append(t)
            got = self._nodes[lm] = (np.array(idx, dtype=np.intp), np.array(per, dtype=float))
        return got

    def _origin(self, origin: str) -> np.ndarray:
        """Rows: up latency, up bandwidth, down latency, down bandwidth, per node.

        The origin's own column is `Network.link`'s (0, inf): latency + bits / inf
        is 0.0, what `Network.delay` returns for a local request.
        """
        got = self._links.get(origin)
        if got is None:
            link = self.network.link
            names = [n.name for n in self.ctx.nodes]
            up = np.array([link(origin, n) for n in names]).T
            down = np.array([link(n, origin) for n in names]).T
            got = self._links[origin] = np.concatenate([up, down])
        return got

    def bound(self, lm: str, origin: str, prompts: int) -> float | None:
        idx, per_prompt = self._lm(lm)
        if not len(idx):
            return None
        prof = self.ctx.service(lm).spec.profile
        up_lat, up_bw, down_lat, down_bw = self._origin(origin)[:, idx]
        # Network.delay's latency + kib * KIB_BITS / bandwidth, term by term
        up = up_lat + prompts * prof.request_kib * KIB_BITS / up_bw
        down = down_lat + prompts * prof.response_kib * KIB_BITS / down_bw
        return float(np.min(up + prompts * per_prompt + down))
