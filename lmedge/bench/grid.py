"""The grid of `lmedge reproduce`: which runs, and lookups over their results.

`plan` turns the command's options into `Experiment`s (one per scenario):

- `testbed`: the paper's nine methods (plus lmedge's `cema` and `lyreo-greedy`,
  marked as not in the paper) for Figs. 6-8 and Tables II-III;
- `testbed-expanded`: MA, MAL and PerLLM for Table IV;
- `bursty`: MA, MAL and PerLLM through the three phases of Fig. 9, each
  phase `slots` long.

`Grid` answers "the mean over seeds of X for (scenario, policy)" for the
evaluation, with the reading of the paper's numbers fixed once here:
latency is the *LM-mean* (the unweighted mean of per-LM mean latencies,
`lm_mean_latency_s`), Jain and J are means over the summary's windows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmedge.bench import paper
from lmedge.bench.runner import RunData, RunSpec, resolve_scenario
from lmedge.bench.stats import Pooled
from lmedge.controller.assembly import PolicyChoice
from lmedge.errors import ConfigError
from lmedge.sim import load_scenario

Summary = dict[str, Any]

#: Methods run on the expanded testbed and the bursty trace (Table IV, Fig. 9).
SHIFT_METHODS: tuple[str, ...] = ("ma", "mal", "perllm")
#: `--quick`: one seed, short runs, no extra profiles -- a smoke test of the whole chain.
QUICK_SEEDS: tuple[int, ...] = (1,)
QUICK_SLOTS = 30


@dataclass(frozen=True)
class Options:
    """What to run. `policies` restricts the methods (default: all nine and the extras)."""

    seeds: tuple[int, ...] = (1, 2, 3)
    slots: int = 200
    quick: bool = False
    policies: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Experiment:
    """One scenario of the grid and the methods run on it."""

    scenario: str
    path: Path
    policies: tuple[str, ...]
    seeds: tuple[int, ...]
    slots: int
    overrides: dict[str, Any] = field(default_factory=dict)
    #: (phase name, first slot, first slot after it) for phased workloads.
    phases: tuple[tuple[str, int, int], ...] = ()


def plan(options: Options) -> list[Experiment]:
    """The grid for `options`; loads each scenario once, so mistakes surface before any run."""
    seeds = QUICK_SEEDS if options.quick else options.seeds
    slots = min(options.slots, QUICK_SLOTS) if options.quick else options.slots
    if slots < 1:
        raise ConfigError(f"--slots must be at least 1, got {slots}")
    if not seeds:
        raise ConfigError("--seeds names no seed")
    bad = [s for s in seeds if s < 0]
    if bad:
        raise ConfigError(f"--seeds must be non-negative integers, got {bad[0]}")
    if len(set(seeds)) != len(seeds):
        raise ConfigError("--seeds names a seed twice")
    everything = paper.METHODS + (() if options.quick else paper.EXTRAS)
    wanted = options.policies if options.policies is not None else everything
    if not wanted:
        raise ConfigError("--policies names no policy")
    for p in wanted:
        PolicyChoice(p).resolve()  # an unknown name fails here, with the known ones listed
    testbed = tuple(dict.fromkeys(wanted))
    shift = tuple(p for p in SHIFT_METHODS if p in testbed)
    out = [Experiment("testbed", resolve_scenario("testbed"), testbed, seeds, slots)]
    if shift:
        out.append(
            Experiment(
                "testbed-expanded", resolve_scenario("testbed-expanded"), shift, seeds, slots
            )
        )
        out.append(_bursty(shift, seeds, slots))
    for e in out:
        load_scenario(e.path, **e.overrides)  # validate now, in this process
    return out


def _bursty(policies: tuple[str, ...], seeds: tuple[int, ...], slots: int) -> Experiment:
    """The bursty trace with every phase `slots` long (the scenario's own length is 200)."""
    path = resolve_scenario("bursty")
    phases = load_scenario(path).spec.workload.phases
    if not phases:
        raise ConfigError(f"scenario {path} has no workload phases")
    docs = []
    bounds = []
    for i, ph in enumerate(phases):
        doc = ph.model_dump(mode="json", exclude_none=True)
        doc["slots"] = slots
        docs.append(doc)
        bounds.append((ph.name, i * slots, (i + 1) * slots))
    overrides = {"workload": {"phases": docs}}
    return Experiment(
        "bursty", path, policies, seeds, slots * len(phases), overrides, tuple(bounds)
    )


def specs(experiments: Sequence[Experiment]) -> list[RunSpec]:
    """Every run of the grid, longest first (keeps a pool busy to the end)."""
    out = [
        RunSpec(e.path, PolicyChoice(p), seed, e.slots, overrides=e.overrides or None)
        for e in experiments
        for p in e.policies
        for seed in e.seeds
    ]
    return heaviest_first(out)


#: Measured: ~3x the CPU time per slot of the others (its solver).
HEAVY = {"milp": 3}


def heaviest_first(runs: Sequence[RunSpec]) -> list[RunSpec]:
    """`runs` longest and costliest first (keeps a pool busy to the end); stable otherwise."""
    return sorted(runs, key=lambda s: -(s.slots or 0) * HEAVY.get(s.choice.profile or "", 1))


def mean(xs: Sequence[float | None]) -> float | None:
    ys = [x for x in xs if x is not None]
    return sum(ys) / len(ys) if ys else None


def window_mean(runs: Sequence[Summary], key: str) -> float | None:
    return mean([mean([w.get(key) for w in s["windows"]]) for s in runs])


class Grid:
    """Lookups over the runs of a reproduction: summaries by (scenario, policy)."""

    def __init__(self, runs: Sequence[RunData]) -> None:
        self.by: dict[tuple[str, str], list[RunData]] = {}
        for r in runs:
            self.by.setdefault((r.summary["scenario"], r.summary["policy"]), []).append(r)

    def summaries(self, scenario: str, policy: str) -> list[Summary]:
        return [r.summary for r in self.by.get((scenario, policy), [])]

    def has(self, scenario: str, policy: str) -> bool:
        return (scenario, policy) in self.by

    def policies(self, scenario: str) -> list[str]:
        return [p for (sc, p) in self.by if sc == scenario]

    def mean(self, scenario: str, policy: str, get: Callable[[Summary], Any]) -> float | None:
        return mean([get(s) for s in self.summaries(scenario, policy)])

    def lm_mean_latency(self, scenario: str, policy: str) -> float | None:
        return self.mean(scenario, policy, lambda s: s.get("lm_mean_latency_s"))

    def latency(self, scenario: str, policy: str) -> float | None:
        return self.mean(scenario, policy, lambda s: s["mean_latency_s"])

    def jain(self, scenario: str, policy: str) -> float | None:
        return window_mean(self.summaries(scenario, policy), "jain")

    def objective(self, scenario: str, policy: str) -> float | None:
        return window_mean(self.summaries(scenario, policy), "objective")

    def per_lm(self, scenario: str, policy: str, lm: str, key: str) -> float | None:
        return self.mean(
            scenario,
            policy,
            lambda s: next((x.get(key) for x in s["per_lm"] if x["lm"] == lm), None),
        )

    def pooled(self, scenario: str, policy: str) -> Pooled:
        runs = self.by.get((scenario, policy), [])
        return Pooled.of([r.requests for r in runs], runs[0].requests.lam if runs else 0.5)
