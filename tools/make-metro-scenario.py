"""Generate examples/metro-1000: 1,000 workers over 40 sites, 16 LMs, ~10,000 requests per slot.

    .venv/bin/python tools/make-metro-scenario.py [--workers 1000] [--sites 40] \
        [--districts 8] [--seed 1] [--out examples/metro-1000]

The output is committed; rerun this script after changing it (same arguments,
same bytes). The cluster is a metro area of `districts` districts with
`sites / districts` sites each:

- Node classes (paper Table I, drawn with its 1 : 4 : 1 mix from a seeded
  stream): CPU-only (24 cores, 32 GiB), single-GPU and dual-GPU (16 cores,
  24 GiB, A5000 24 GiB time-sliced into 2 vGPUs per GPU).
- Link classes: inside a site the paper's 10 Gbit/s rack network (0.5 ms);
  between sites of one district the testbed's metro fibre (1 Gbit/s, 2 ms);
  between districts a regional backhaul (500 Mbit/s, 8 ms; assumption). Each
  node declares its own district's links; a cross-district pair is declared
  once, on the first node of the lower-numbered site (the emulator reads a
  site pair from any node at either end), which keeps nodes.yaml small.
- 16 LMServices: the paper's four types (simple and complex text-to-text,
  image-to-text, text-to-image) in four sizes each (xs, s, m, l), scaled from
  the testbed's calibrated LM1-LM4 (`examples/testbed/services.yaml`): service
  time and memory x0.6 / x1 / x1.4 / x1.8 (assumption).
- Workload: every worker is an origin of every LM each slot; K ~ U{0..2} for
  the text and captioning LMs and U{0..1} for text-to-image (a 10-s prompt),
  i.e. ~10 requests per origin and slot, ~10,000 per slot in all, about two
  thirds of the cluster's GPU time (assumption: the paper's K ~ U{0..8} per
  origin would offer 8x the testbed's capacity at this node-to-origin ratio).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from lmedge.sim.synthetic import edge_node, scenario_doc

ROOT = Path(__file__).resolve().parents[1]

INTRA = (10_000, 0.5)  # the EdgeNode default and the testbed's rack network (paper §V-C: 100 GbE)
METRO = (1_000.0, 2.0)  # the testbed's inter-site fibre
BACKHAUL = (500.0, 8.0)  # assumption: a regional link between districts
MAX_LINKS = 64  # links one EdgeNode may declare (lmedge.api.resources.EdgeNodeSpec)

SIZES = {"xs": 0.6, "s": 1.0, "m": 1.4, "l": 1.8}
#: The four types, from the testbed's calibrated LMs (examples/testbed/services.yaml).
TYPES: list[dict[str, Any]] = [
    # (prefix, modality, runsOn, gpu s, cpu s, min/deployment memory, vRAM, KiB in/out, max K)
    dict(
        prefix="chat",
        model="gpt2",
        modality="text-to-text",
        runs_on="cpu-or-gpu",
        gpu_s=0.6,
        cpu_s=8.15,
        min_mem=1.2,
        mem=3.0,
        vram=1.0,
        kib=(1, 2),
        k_max=2,
    ),
    dict(
        prefix="reason",
        model="gpt2-large",
        modality="text-to-text",
        runs_on="cpu-or-gpu",
        gpu_s=1.2,
        cpu_s=30.0,
        min_mem=6.5,
        mem=9.0,
        vram=3.5,
        kib=(1, 4),
        k_max=2,
    ),
    dict(
        prefix="caption",
        model="blip-image-captioning-base",
        modality="image-to-text",
        runs_on="gpu-only",
        gpu_s=0.5,
        cpu_s=None,
        min_mem=0.5,
        mem=2.5,
        vram=2.0,
        kib=(200, 1),
        k_max=2,
    ),
    dict(
        prefix="image",
        model="stable-diffusion-v1-5",
        modality="text-to-image",
        runs_on="gpu-only",
        gpu_s=9.93,
        cpu_s=None,
        min_mem=1.6,
        mem=3.5,
        vram=4.0,
        kib=(1, 500),
        k_max=1,
    ),
]


def services() -> tuple[list[dict[str, Any]], dict[str, dict[str, int]]]:
    out: list[dict[str, Any]] = []
    prompts: dict[str, dict[str, int]] = {}
    for t in TYPES:
        for size, f in SIZES.items():
            name = f"{t['prefix']}-{size}"
            profile: dict[str, Any] = {
                "gpuSecondsPerPrompt": round(t["gpu_s"] * f, 3),
                "requestKib": t["kib"][0],
                "responseKib": t["kib"][1],
            }
            if t["cpu_s"] is not None:
                profile["cpuSecondsPerPrompt"] = round(t["cpu_s"] * f, 3)
            spec = {
                "model": f"{t['model']}-{size}",
                "modality": t["modality"],
                "image": f"ghcr.io/lmedge/model-server-{t['prefix']}-{size}:0.1.0",
                "minMemoryGib": round(t["min_mem"] * f, 2),
                "deploymentMemoryGib": round(t["mem"] * f, 2),
                "minVramGib": round(t["vram"] * f, 2),
                "runsOn": t["runs_on"],
                "defaultCpuCores": 4,
                "maxVgpus": 2,
                "profile": profile,
            }
            meta = {"name": name, "labels": {"lmedge.io/type": t["prefix"], "lmedge.io/size": size}}
            out.append({"apiVersion": "lmedge.io/v1alpha1", "kind": "LMService", "metadata": meta, "spec": spec})
            prompts[name] = {"min": 0, "max": t["k_max"]}
    return out, prompts


def cluster(workers: int, sites: int, districts: int, seed: int) -> list[dict[str, Any]]:
    if sites % districts or workers < sites:
        raise SystemExit("--sites must be a multiple of --districts and --workers >= --sites")
    per = sites // districts
    if sites - per > (workers // sites) * (MAX_LINKS - per + 1):
        raise SystemExit("too few workers a site to declare every cross-district link")
    names = [f"d{d + 1}-s{s + 1}" for d in range(districts) for s in range(per)]
    district = {n: i // per for i, n in enumerate(names)}

    def links(site: str, k: int) -> list[tuple[str, float, float]]:
        """The links the site's `k`-th node declares (k = -1: the control node)."""
        out = [(s, *METRO) for s in names if s != site and district[s] == district[site]]
        if k >= 0:  # cross-district pairs, once per pair: on the lower-numbered site,
            # spread over its nodes in order so that none declares more than an
            # EdgeNode may (metro-1000's fit on each site's first node)
            i = names.index(site)
            cross = [(s, *BACKHAUL) for s in names[i + 1 :] if district[s] != district[site]]
            room = MAX_LINKS - len(out)
            out += cross[k * room : (k + 1) * room]
        return out

    rng = np.random.default_rng([seed, 17])
    kinds = rng.choice(3, size=workers, p=[1 / 6, 4 / 6, 1 / 6])  # Table I: 1 CPU : 4 x1 : 1 x2
    out = [
        edge_node(
            "control",
            cores=8,
            memory_gib=16,
            site=names[0],
            role="control",
            links=links(names[0], -1),
        )
    ]
    width = len(str(workers))
    for i in range(workers):
        site = names[i % sites]
        common = dict(site=site, links=links(site, i // sites))
        name = f"worker-{i + 1:0{width}d}"
        if kinds[i] == 0:
            out.append(edge_node(name, cores=24, memory_gib=32, **common))  # type: ignore[arg-type]
        else:
            out.append(edge_node(name, gpus=int(kinds[i]), **common))  # type: ignore[arg-type]
    for n in out:
        # the rack network is the EdgeNode default: leave it out (a smaller, faster file)
        spec = n["spec"]
        assert (spec.pop("intraSiteBandwidthMbps"), spec.pop("intraSiteLatencyMs")) == INTRA
    return out


class _Flow(yaml.SafeDumper):
    """Block style for documents, flow style for each leaf mapping/list (one link per line)."""


def _represent_dict(dumper: yaml.SafeDumper, data: dict[str, Any]) -> yaml.Node:
    flow = all(not isinstance(v, (dict, list)) for v in data.values())
    return dumper.represent_mapping("tag:yaml.org,2002:map", data.items(), flow_style=flow)


_Flow.add_representer(dict, _represent_dict)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--workers", type=int, default=1000)
    ap.add_argument("--sites", type=int, default=40)
    ap.add_argument("--districts", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=ROOT / "examples" / "metro-1000")
    args = ap.parse_args()
    testbed = yaml.safe_load((ROOT / "examples" / "testbed" / "scenario.yaml").read_text())
    svcs, prompts = services()
    cmd = (
        f"tools/make-metro-scenario.py --workers {args.workers} --sites {args.sites} "
        f"--districts {args.districts} --seed {args.seed}"
    )
    header = (
        f"Generated by {cmd}; do not edit by hand.\n"
        "Classes and sources: see the generator's docstring and examples/testbed."
    )
    doc = scenario_doc(
        args.out.name,
        description=f"{args.workers} workers over {args.sites} sites in {args.districts} "
        "districts, 16 LMs (4 types x 4 sizes), ~10 requests per origin and slot.",
        loop=testbed["loop"],
        emulation=testbed["emulation"],
        workload={
            "prompts": {"min": 0, "max": 2},
            "arrivalSpread": 1.0,
            "phases": [{"name": "steady", "slots": testbed["loop"]["slots"], "prompts": prompts}],
        },
    )
    prefix = "".join(f"# {line}\n" for line in header.splitlines())
    args.out.mkdir(parents=True, exist_ok=True)
    nodes = cluster(args.workers, args.sites, args.districts, args.seed)
    dump = {"Dumper": _Flow, "sort_keys": False, "width": 200}
    (args.out / "nodes.yaml").write_text(prefix + yaml.dump_all(nodes, **dump))  # type: ignore[call-overload]
    (args.out / "services.yaml").write_text(prefix + yaml.dump_all(svcs, **dump))  # type: ignore[call-overload]
    (args.out / "scenario.yaml").write_text(prefix + yaml.safe_dump(doc, sort_keys=False))
    print(f"wrote {args.out} ({args.workers} workers, {len(svcs)} LMs)")


if __name__ == "__main__":
    main()
