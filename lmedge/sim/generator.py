"""A scenario generator: a seeded draw of an edge cluster, its LMs, its load and its events.

The robustness bench ranks every profile on clusters nobody tuned for; this
module draws them. `generate(seed, pool)` returns the files of one scenario
folder (`write` puts them on disk): `nodes.yaml`, `services.yaml`,
`scenario.yaml`, `timeline.yaml` and `generated.yaml`, which lists every
value drawn, so a folder reads and re-runs on its own. Same seed, bounds and
pool -> the same bytes. Every distribution is one line of `DISTRIBUTIONS`,
the text the command's help and `docs/scenarios.md` show.

The LMs are drawn from a pool of shipped LMService manifests (by default
`examples/metro-1000/services.yaml`: the testbed's four calibrated types,
simple and complex text-to-text, image-to-text, text-to-image, in four sizes)
and keep their service times; only their names and images stay as shipped.
The load is set with the project's GPU capacity estimate: an LM's capacity
on a node with all its vGPUs is `lmedge.agents.rules.capacity.gpu_rate` (GPUs
/ gpuSecondsPerPrompt prompts per second, the rules' cost model), and the
load of a demand is the sum over LMs of demand / capacity summed over GPU
nodes. CPU cores are headroom it does not count (a text LM needs 13-25x its
GPU time there).

It does not run anything, and it does not draw token-engine LMs (their
1-second slots are another regime) or GPU speeds (the emulator's pipeline
service times do not depend on the GPU model; a GPU class sets vRAM and
time-slicing).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from lmedge.agents.rules.capacity import gpu_rate
from lmedge.api import hosting
from lmedge.api.manifests import API, parse_resources
from lmedge.api.resources import EdgeNodeSpec, LMServiceSpec
from lmedge.errors import ConfigError
from lmedge.sim.synthetic import edge_node, scenario_doc

#: Changes whenever a seed would draw something else: recorded in generated.yaml.
GENERATOR_VERSION = 1
#: Distinguishes the generator's stream from the emulator's seeded streams.
GENERATOR_STREAM = 28

#: GPU classes the project's scenarios and profiles know (examples/testbed, examples/llm-edge).
GPU_CLASSES: tuple[tuple[str, float], ...] = (
    ("NVIDIA-A5000", 24.0),
    ("NVIDIA-RTX-3090", 24.0),
    ("NVIDIA-RTX-4090", 24.0),
    ("NVIDIA-L4", 24.0),
    ("NVIDIA-A2", 16.0),
    ("NVIDIA-RTX-3080", 10.0),
)
#: Link classes (bandwidth Mbit/s, latency ms): the testbed's rack network and
#: metro fibre, and examples/metro-1000's regional backhaul (assumption).
RACK = (10_000.0, 0.5)
METRO = (1_000.0, 2.0)
BACKHAUL = (500.0, 8.0)
#: The testbed's loop and emulation (examples/testbed/scenario.yaml), written into every scenario.
LOOP = {"slotS": 30, "epochSlots": 50, "tauS": 900, "lam": 0.5}
EMULATION: dict[str, Any] = {
    "coldStart": {"medianS": 9.34, "p95S": 12.23, "maxS": 13.58},
    "cpuParallelFraction": 0.8,
    "cpuSlowdown": {"eta0": 0.7, "beta": 0.5},
    "memorySlowdown": {"eta0": 0.8, "beta": 0.5},
    "gpuSlowdown": {"eta0": 0.5, "beta": 0.2},
    "gpuHostCores": 1.0,
    "serviceTimeCv": 0.1,
    "gpuBinding": "spread",
}

#: Every distribution the generator draws from, as the help and docs/scenarios.md show it.
DISTRIBUTIONS: tuple[str, ...] = (
    "sites S ~ U{1..8}; districts D ~ U{1..ceil(S/2)}, each site in one (uniform, every "
    "district used)",
    "workers W ~ U{max(4, S)..60}: one per site first, the rest uniform over sites; one "
    "control node",
    "links: in a site 10 Gbit/s 0.5 ms (rack); same district 1 Gbit/s 2 ms (metro); else "
    "500 Mbit/s 8 ms (backhaul); latency x U[0.75, 1.5] per site pair",
    "node kind per worker: CPU-only / 1 GPU / 2 GPUs / 4 GPUs with probabilities (c, "
    "(1-c) 0.6, (1-c) 0.3, (1-c) 0.1), c ~ U[0, 0.4]; worker 1 always has a GPU",
    "GPU class: 1-3 classes per scenario from A5000, RTX-3090, RTX-4090, L4 (24 GiB), A2 "
    "(16), RTX-3080 (10), uniform per node; vGPUs per GPU in {1, 2, 4} w.p. (0.25, 0.5, 0.25)",
    "node size: CPU-only cores {16, 24, 32}, memory {32, 64} GiB; GPU node cores {8, 16, 32}, "
    "memory {24, 32, 64} GiB (uniform)",
    "LMs L ~ U{3..10} from the pool without replacement, at least one CPU-capable and one GPU-only",
    "load rho ~ U[0.5, 1.2] of the GPU capacity estimate; bottleneck w.p. 0.5: one LM takes "
    "a share U[0.4, 0.7] of the GPU time, the rest Dirichlet(2); else Dirichlet(5) shares",
    "per-origin demand per LM: uniform w.p. 0.5; skewed w.p. 0.3 (origin weights "
    "Dirichlet(0.5)); hotspot w.p. 0.2 (one site's origins get U[0.6, 0.9] of it); K ~ "
    "U{0..k} per origin, sum of k = round(2 x mean prompts per slot) by largest remainder "
    "(>= 1)",
    "node churn: U{0..max(1, W/4)} workers (never worker 1) down at a slot U[0.1, 0.8] T, "
    "back after U[0.1, 0.3] T, or deleted for good w.p. 0.25",
    "LMService applied w.p. 0.7 at U[0.2, 0.6] T (a pool LM not yet in use, with its own "
    "share); edited w.p. 0.5 at U[0.3, 0.7] T (service times x U[0.7, 1.3], new image); "
    "deleted w.p. 0.5 at U[0.5, 0.9] T (not the bottleneck or the edited one)",
    "link shock (S >= 2) w.p. 0.6: a site pair at U[0.2, 0.7] T, latency x U[3, 20], "
    "bandwidth / U[2, 20], restored after U[0.1, 0.3] T",
    "loop and emulation: the testbed's (30-s slots, 50-slot epochs, tau 900 s); T = the run "
    "length in slots",
)


@dataclass(frozen=True)
class Bounds:
    """The sizes a generator run may draw (the issue's defaults; the bench narrows workers)."""

    min_workers: int = 4
    max_workers: int = 60
    max_sites: int = 8
    min_lms: int = 3
    max_lms: int = 10
    slots: int = 200

    def check(self) -> None:
        if not 1 <= self.min_workers <= self.max_workers:
            raise ConfigError(
                f"workers: need 1 <= min <= max, got {self.min_workers}-{self.max_workers}"
            )
        if self.max_sites < 1:
            raise ConfigError(f"max sites must be at least 1, got {self.max_sites}")
        if not 2 <= self.min_lms <= self.max_lms:
            raise ConfigError(f"LMs: need 2 <= min <= max, got {self.min_lms}-{self.max_lms}")
        if self.slots < 1:
            raise ConfigError(f"slots must be at least 1, got {self.slots}")


@dataclass(frozen=True)
class GeneratedScenario:
    """The files of one scenario folder, as text (name -> content)."""

    name: str
    files: dict[str, str]

    def write(self, folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in self.files.items():
            (folder / name).write_text(text)
        return folder


def load_pool(path: Path) -> list[dict[str, Any]]:
    """The pool's LMService manifests (validated; pipeline engines only)."""
    from lmedge.api.manifests import read_documents

    docs = read_documents(path)
    _, services = parse_resources(docs)
    pool = [raw for _, raw in docs if raw.get("kind") == "LMService"]
    token = [s.name for s in services if s.spec.engine.kind != "pipeline"]
    if token:
        raise ConfigError(f"{path}: token-engine LMs are not drawn: {', '.join(token)}")
    if len(pool) < 3:
        raise ConfigError(f"{path}: the pool needs at least 3 LMServices, has {len(pool)}")
    return pool


def generate(
    seed: int, pool: Sequence[dict[str, Any]], bounds: Bounds = Bounds()
) -> GeneratedScenario:
    """Draw one scenario (see `DISTRIBUTIONS`)."""
    bounds.check()
    if seed < 0:
        raise ConfigError(f"seed must be non-negative, got {seed}")
    return _Draw(seed, list(pool), bounds).scenario()


def _r(x: float, digits: int = 4) -> float:
    """Rounded for the written files (readable, and the same text on every platform)."""
    return float(f"{x:.{digits}g}")


class _Draw:
    """One generator run: draws in a fixed order from one seeded stream."""

    def __init__(self, seed: int, pool: list[dict[str, Any]], bounds: Bounds) -> None:
        self.seed = seed
        self.pool = pool
        self.b = bounds
        self.rng = np.random.default_rng([seed, GENERATOR_STREAM])
        self.name = f"gen-{seed}"
        self.slots = bounds.slots

    def u(self, lo: float, hi: float) -> float:
        return float(self.rng.uniform(lo, hi))

    def i(self, lo: int, hi: int) -> int:
        return int(self.rng.integers(lo, hi + 1))

    def pick(self, items: Sequence[Any]) -> Any:
        return items[int(self.rng.integers(len(items)))]

    def at(self, lo: float, hi: float) -> int:
        """A slot at a fraction U[lo, hi] of the run (at least 1)."""
        return max(1, round(self.u(lo, hi) * self.slots))

    # -- the cluster -------------------------------------------------------------

    def cluster(self) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        b = self.b
        n_sites = self.i(1, b.max_sites)
        n_districts = self.i(1, math.ceil(n_sites / 2))
        workers = self.i(max(b.min_workers, n_sites), max(b.max_workers, n_sites))
        sites = [f"s{k + 1}" for k in range(n_sites)]
        district = [k % n_districts for k in range(n_sites)]  # every district used
        self.rng.shuffle(district)
        links: dict[tuple[str, str], tuple[float, float]] = {}
        for a in range(n_sites):
            for c in range(a + 1, n_sites):
                bw, lat = METRO if district[a] == district[c] else BACKHAUL
                links[(sites[a], sites[c])] = (bw, _r(lat * self.u(0.75, 1.5), 3))
        cpu_share = self.u(0.0, 0.4)
        p_kind = [cpu_share, *((1 - cpu_share) * w for w in (0.6, 0.3, 0.1))]
        n_classes = self.i(1, 3)
        classes = [GPU_CLASSES[k] for k in self.rng.choice(len(GPU_CLASSES), n_classes, False)]
        site_of = [sites[k] if k < n_sites else self.pick(sites) for k in range(workers)]

        def site_links(site: str) -> list[tuple[str, float, float]]:
            out = []
            for (a, c), (bw, lat) in links.items():
                if site in (a, c):
                    out.append((c if site == a else a, bw, lat))
            return sorted(out)

        nodes = [
            edge_node(
                "control",
                cores=8,
                memory_gib=16,
                site=sites[0],
                role="control",
                links=site_links(sites[0]),
            )
        ]
        kinds = []
        width = len(str(workers))
        for k in range(workers):
            kind = int(self.rng.choice(4, p=p_kind)) if k else self.i(1, 3)
            gpus = (0, 1, 2, 4)[kind]
            name = f"worker-{k + 1:0{width}d}"
            common: dict[str, Any] = {"site": site_of[k], "links": site_links(site_of[k])}
            if gpus == 0:
                cores, mem = self.pick((16, 24, 32)), self.pick((32, 64))
                nodes.append(edge_node(name, cores=cores, memory_gib=mem, **common))
                kinds.append(
                    {"node": name, "site": site_of[k], "gpus": 0, "cores": cores, "memoryGib": mem}
                )
                continue
            model, vram = self.pick(classes)
            vgpus = int(self.rng.choice((1, 2, 4), p=(0.25, 0.5, 0.25)))
            cores, mem = self.pick((8, 16, 32)), self.pick((24, 32, 64))
            node = edge_node(
                name,
                cores=cores,
                memory_gib=mem,
                gpus=gpus,
                vram_gib=vram,
                vgpus_per_gpu=vgpus,
                **common,
            )
            for g in node["spec"]["gpus"]:
                g["model"] = model
            nodes.append(node)
            kinds.append(
                {
                    "node": name,
                    "site": site_of[k],
                    "gpus": gpus,
                    "gpuModel": model,
                    "vramGib": vram,
                    "vgpusPerGpu": vgpus,
                    "cores": cores,
                    "memoryGib": mem,
                }
            )
        drawn = {
            "sites": n_sites,
            "districts": {s: f"d{district[k] + 1}" for k, s in enumerate(sites)},
            "workers": workers,
            "cpuOnlyShare": _r(cpu_share),
            "gpuClasses": [m for m, _ in classes],
            "links": [
                {"sites": [a, c], "bandwidthMbps": bw, "latencyMs": lat}
                for (a, c), (bw, lat) in links.items()
            ],
            "nodes": kinds,
        }
        return nodes, drawn

    # -- the LMs and their load --------------------------------------------------

    def lms(self) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
        """The initial LMs (at least one CPU-capable, one GPU-only) and one to apply later."""
        n = self.i(min(self.b.min_lms, len(self.pool) - 1), min(self.b.max_lms, len(self.pool) - 1))
        order = [self.pool[k] for k in self.rng.permutation(len(self.pool))]
        cpu = next((m for m in order if m["spec"].get("runsOn") == "cpu-or-gpu"), None)
        gpu = next((m for m in order if m["spec"].get("runsOn") != "cpu-or-gpu"), None)
        first = [m for m in (cpu, gpu) if m is not None]
        rest = [m for m in order if all(m is not f for f in first)]
        chosen = first + rest[: n - len(first)]
        spare = rest[n - len(first)] if len(rest) > n - len(first) else None
        names = {m["metadata"]["name"] for m in chosen}
        in_pool_order = [m for m in self.pool if m["metadata"]["name"] in names]
        return in_pool_order, spare

    def shares(self, names: list[str]) -> tuple[dict[str, float], str | None]:
        if self.rng.random() < 0.5:
            w = self.rng.dirichlet([5.0] * len(names))
            return {n: float(x) for n, x in zip(names, w, strict=True)}, None
        neck = self.pick(names)
        top = self.u(0.4, 0.7)
        others = [n for n in names if n != neck]
        w = self.rng.dirichlet([2.0] * len(others))
        out = {n: float(x) * (1 - top) for n, x in zip(others, w, strict=True)}
        out[neck] = top
        return {n: out[n] for n in names}, neck

    def origin_weights(self, origins: list[str], site_of: dict[str, str]) -> dict[str, Any]:
        mode = str(self.rng.choice(["uniform", "skewed", "hotspot"], p=[0.5, 0.3, 0.2]))
        if mode == "uniform":
            w = np.full(len(origins), 1.0 / len(origins))
            return {"mode": mode, "weights": w}
        if mode == "skewed":
            return {"mode": mode, "weights": self.rng.dirichlet([0.5] * len(origins))}
        site = self.pick(sorted(set(site_of.values())))
        frac = self.u(0.6, 0.9)
        hot = [o for o in origins if site_of[o] == site]
        cold = len(origins) - len(hot)
        if not cold:
            frac = 1.0
        w = np.array(
            [frac / len(hot) if site_of[o] == site else (1 - frac) / cold for o in origins]
        )
        return {"mode": mode, "site": site, "fraction": _r(frac), "weights": w}

    # -- the whole scenario ------------------------------------------------------

    def scenario(self) -> GeneratedScenario:
        nodes, cluster = self.cluster()
        initial, spare = self.lms()
        apply_lm = spare if spare is not None and self.rng.random() < 0.7 else None
        lm_docs = initial + ([apply_lm] if apply_lm is not None else [])
        names = [m["metadata"]["name"] for m in lm_docs]
        node_info, svc_info = parse_resources([("generated", d) for d in nodes + lm_docs])
        workers = [n for n in node_info if n.spec.role == "worker"]
        capacity = {s.name: _capacity(s.spec, [n.spec for n in workers]) for s in svc_info}
        slot_s = float(LOOP["slotS"])
        rho = self.u(0.5, 1.2)
        shares, neck = self.shares(names)
        origins = [n.name for n in workers]
        site_of = {n.name: n.spec.site for n in workers}
        # mean prompts per slot over the cluster: its share of rho, in prompts, per slot
        means = {lm: shares[lm] * rho * capacity[lm] * slot_s for lm in names}
        phase: dict[str, dict[str, int]] = {}
        per_origin: dict[str, dict[str, dict[str, int]]] = {}
        demand: list[dict[str, Any]] = []
        written_load = 0.0
        for lm in names:
            loc = self.origin_weights(origins, site_of)
            ks = _largest_remainder(max(1, round(2 * means[lm])), loc["weights"])
            common = max(set(ks), key=lambda k: (ks.count(k), -k))
            phase[lm] = {"min": 0, "max": common}
            for o, k in zip(origins, ks, strict=True):
                if k != common:
                    per_origin.setdefault(o, {})[lm] = {"min": 0, "max": k}
            written = sum(ks) / 2
            written_load += written / (capacity[lm] * slot_s)
            entry = {
                "lm": lm,
                "gpuShare": _r(shares[lm]),
                "targetPromptsPerSlot": _r(means[lm]),
                "writtenPromptsPerSlot": _r(written),
                "origins": loc["mode"],
            }
            entry.update({k: v for k, v in loc.items() if k in ("site", "fraction")})
            demand.append(entry)
        events, churn = self.timeline(workers, initial, apply_lm, neck, cluster)
        workload: dict[str, Any] = {
            "prompts": {"min": 0, "max": 0},
            "arrivalSpread": 1.0,
            "phases": [{"name": "steady", "slots": self.slots, "prompts": phase}],
        }
        if per_origin:
            workload["originPrompts"] = {o: per_origin[o] for o in origins if o in per_origin}
        doc = scenario_doc(
            self.name,
            description=(
                f"Generated by `lmedge scenarios generate --seed {self.seed}`: "
                f"{cluster['workers']} workers over {cluster['sites']} sites, {len(initial)} LMs, "
                f"load {rho:.2f} of GPU capacity"
                + (f", bottleneck {neck}" if neck else "")
                + "; every draw is in generated.yaml."
            ),
            loop={**LOOP, "slots": self.slots},
            emulation=EMULATION,
            workload=workload,
        )
        if events:
            doc["timeline"] = "timeline.yaml"
        generated = {
            "generator": {"version": GENERATOR_VERSION, "seed": self.seed, **_bounds(self.b)},
            "cluster": cluster,
            "lms": {
                "initial": [m["metadata"]["name"] for m in initial],
                "appliedLater": apply_lm["metadata"]["name"] if apply_lm else None,
            },
            "load": {
                "target": _r(rho),
                "written": _r(written_load),
                "bottleneck": neck,
                "capacityPromptsPerSlot": {lm: _r(capacity[lm] * slot_s) for lm in names},
                "demand": demand,
            },
            "timeline": churn,
        }
        header = (
            f"Generated by `lmedge scenarios generate --seed {self.seed}` (generator v"
            f"{GENERATOR_VERSION}); the draws are in generated.yaml. Same seed, same bytes.\n"
        )
        prefix = "".join(f"# {line}\n" for line in header.splitlines())
        files = {
            "nodes.yaml": prefix + _dump_all(nodes),
            "services.yaml": prefix + _dump_all(initial),
            "scenario.yaml": prefix + _dump(doc),
            "generated.yaml": prefix + _dump(generated),
        }
        if events:
            tl = {
                "apiVersion": API,
                "kind": "Timeline",
                "metadata": {"name": self.name},
                "events": events,
            }
            files["timeline.yaml"] = prefix + _dump(tl)
        return GeneratedScenario(self.name, files)

    def timeline(
        self,
        workers: Sequence[Any],
        initial: list[dict[str, Any]],
        apply_lm: dict[str, Any] | None,
        neck: str | None,
        cluster: dict[str, Any],
    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        events: list[dict[str, Any]] = []
        drawn: dict[str, Any] = {}
        # node churn: never the first worker (the one sure GPU node)
        n_churn = self.i(0, max(1, len(workers) // 4)) if len(workers) > 1 else 0
        size = min(n_churn, len(workers) - 1)
        picked = (
            self.rng.choice(len(workers) - 1, size=size, replace=False).tolist() if size else []
        )
        churn = []
        for k in sorted(int(x) + 1 for x in picked):
            node = workers[k].name
            slot = self.at(0.1, 0.8)
            if self.rng.random() < 0.25:
                events.append({"slot": slot, "delete": {"kind": "EdgeNode", "name": node}})
                churn.append({"node": node, "slot": slot, "deleted": True})
            else:
                until = slot + max(1, round(self.u(0.1, 0.3) * self.slots))
                events.append(
                    {
                        "slot": slot,
                        "nodeDown": {
                            "node": node,
                            "untilSlot": until,
                            "reason": "generated outage",
                        },
                    }
                )
                churn.append({"node": node, "slot": slot, "untilSlot": until})
        drawn["nodeChurn"] = churn
        if apply_lm is not None:
            slot = self.at(0.2, 0.6)
            events.append({"slot": slot, "apply": apply_lm})
            drawn["applied"] = {"lm": apply_lm["metadata"]["name"], "slot": slot}
        edited = None
        if self.rng.random() < 0.5:
            target = self.pick(initial)
            edited = target["metadata"]["name"]
            factor = _r(self.u(0.7, 1.3), 3)
            slot = self.at(0.3, 0.7)
            new = _edited(target, factor)
            events.append({"slot": slot, "apply": new})
            drawn["edited"] = {"lm": edited, "slot": slot, "serviceTimeFactor": factor}
        candidates = [m["metadata"]["name"] for m in initial]
        candidates = [n for n in candidates if n not in (neck, edited)]
        if len(initial) > 2 and candidates and self.rng.random() < 0.5:
            lm = self.pick(candidates)
            slot = self.at(0.5, 0.9)
            events.append({"slot": slot, "delete": {"kind": "LMService", "name": lm}})
            drawn["deleted"] = {"lm": lm, "slot": slot}
        links = cluster["links"]
        if links and self.rng.random() < 0.6:
            link = self.pick(links)
            slot = self.at(0.2, 0.7)
            back = slot + max(1, round(self.u(0.1, 0.3) * self.slots))
            lat = _r(link["latencyMs"] * self.u(3, 20), 3)
            bw = _r(link["bandwidthMbps"] / self.u(2, 20), 3)
            events.append(
                {
                    "slot": slot,
                    "link": {"sites": link["sites"], "latencyMs": lat, "bandwidthMbps": bw},
                }
            )
            events.append(
                {
                    "slot": back,
                    "link": {
                        "sites": link["sites"],
                        "latencyMs": link["latencyMs"],
                        "bandwidthMbps": link["bandwidthMbps"],
                    },
                }
            )
            drawn["linkShock"] = {
                "sites": link["sites"],
                "slot": slot,
                "untilSlot": back,
                "latencyMs": lat,
                "bandwidthMbps": bw,
            }
        events.sort(key=lambda e: e["slot"])
        return events, drawn


def _capacity(svc: LMServiceSpec, nodes: Sequence[EdgeNodeSpec]) -> float:
    """Prompts per second the GPU nodes serve of this LM alone, all vGPUs busy."""
    return sum(gpu_rate(svc, n, n.total_vgpus) for n in nodes if "gpu" in hosting.modes(n, svc))


def _largest_remainder(total: int, weights: np.ndarray) -> list[int]:
    """`total` split in integers proportional to `weights` (largest remainder, ties by index)."""
    raw = weights / weights.sum() * total
    out = np.floor(raw).astype(np.int64)
    left = total - int(out.sum())
    order = sorted(range(len(raw)), key=lambda k: (-(raw[k] - out[k]), k))
    for k in order[:left]:
        out[k] += 1
    return [int(x) for x in out]


def _edited(manifest: dict[str, Any], factor: float) -> dict[str, Any]:
    """The LMService with a new image and service times scaled by `factor`."""
    spec = dict(manifest["spec"])
    profile = dict(spec["profile"])
    for key in ("gpuSecondsPerPrompt", "cpuSecondsPerPrompt"):
        if key in profile:
            profile[key] = _r(profile[key] * factor, 3)
    spec["profile"] = profile
    image = str(spec["image"])
    spec["image"] = image.rsplit(":", 1)[0] + ":0.2.0-generated"
    return {**manifest, "spec": spec}


class _Dumper(yaml.SafeDumper):
    """Plain YAML: no anchors or aliases where the same list is written twice."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _dump(doc: Any) -> str:
    return yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=200)


def _dump_all(docs: Sequence[Any]) -> str:
    return yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False, width=200)


def _bounds(b: Bounds) -> dict[str, Any]:
    return {
        "workers": [b.min_workers, b.max_workers],
        "maxSites": b.max_sites,
        "lms": [b.min_lms, b.max_lms],
        "slots": b.slots,
    }
