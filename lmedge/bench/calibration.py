"""How far a scenario's physics is from the paper's published facts (`lmedge calibration-check`).

The emulator's service times (`LMService.profile`) are physical inputs; the
paper never prints them, only what came out of its testbed. This module runs
a scenario under the paper's reference conditions for a few seeds and sets
each published fact beside lmedge's value, with the distance. It is a
*report*: it decides nothing and fails only on errors, so a scenario far
from the paper is printed as far, never refused.

Reference conditions (arXiv 2602.07215v2):

- **Pre-benchmark** (§V-D2): "344 successful requests in the pre-benchmark
  service profile", median end-to-end 9.76 s, 83.72% within 30 s. The paper
  does not name the policy of that profile; the agents were running (it
  also measured their response latency), so lmedge uses its default
  profile, `ma`, from a cold cluster, for `PRE_SLOTS` slots (16 slots of the
  testbed's workload are ~340 requests, the size of the paper's sample).
- **Random routing + random deployment** (§V-D2, the tau trial): 67.3% of
  9,453 requests completed within tau = 900 s; profile `rr`.
- **MILP** (§VI-A, Fig. 7): LM1-LM3 success 1.000 at mean latencies 8.0 /
  12.6 / 7.2 s, LM4 success 0.192 at 877.7 s, LM-mean latency 226.6 s.
- **MA** (§VI-A, Fig. 7): LM4 success 0.479 at about 339 s, the capacity
  left to LM4 after LM1-LM3 are served.

Static facts need no run: GPT-2-large is not faster than GPT-2, MILP's
LM1-LM3 latencies bound their per-prompt times, and LM4's alpha_gpu = 3.02
is a true capacity (30 / 3.02 s per prompt).

The paper's LMs are found by model id (the last path segment, as the
`lyapunov` deployer matches its weights: `gpt2`, `gpt2-large`,
`blip-image-captioning-base`, `stable-diffusion-v1-5`); a fact about an LM
the scenario does not have is reported as not applicable. Requests of all
seeds are pooled, as the paper pools its requests.
"""

from __future__ import annotations

import multiprocessing
import statistics
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from lmedge.api import ClusterContext
from lmedge.bench.runner import RunSpec, Setup, run
from lmedge.controller.assembly import PolicyChoice
from lmedge.errors import ConfigError
from lmedge.policies.lyapunov.deployer import model_key
from lmedge.sim import load_scenario

#: Model keys of the paper's LM1-LM4 (§V-B).
PAPER_MODELS: dict[str, str] = {
    "LM1": "gpt2",
    "LM2": "gpt2-large",
    "LM3": "blip-image-captioning-base",
    "LM4": "stable-diffusion-v1-5",
}
#: Slots of the pre-benchmark run (see the module docstring).
PRE_SLOTS = 16
#: Reference policies: the pre-benchmark, the tau trial, MILP and MA.
PRE_POLICY = "ma"
REFERENCE_POLICIES: tuple[str, ...] = ("rr", "milp", "ma")
#: Mean prompts of a request the paper's workload sends: K ~ U{0..8}, a set
#: with K = 0 is no request, so E[K | K > 0] = 4.5.
MEAN_PROMPTS = 4.5


@dataclass(frozen=True)
class Request:
    """What the check needs of one measured request."""

    lm: str
    success: bool
    latency_s: float


@dataclass(frozen=True)
class Measured:
    """Requests of every seed of one reference run, pooled."""

    policy: str
    slots: int
    seeds: tuple[int, ...]
    requests: tuple[Request, ...]

    def of(self, lm: str | None) -> list[Request]:
        return [r for r in self.requests if lm is not None and r.lm == lm]

    def successes(self, lm: str | None = None) -> list[Request]:
        pool = self.requests if lm is None else self.of(lm)
        return [r for r in pool if r.success]


@dataclass(frozen=True)
class Fact:
    """One published fact and how lmedge measures its analog."""

    key: str
    text: str
    source: str
    run: str  # a reference run's name, or "static"
    paper: float
    unit: str
    measure: Callable[[ClusterContext, dict[str, Measured]], float | None]
    #: "~": lmedge should be near `paper`; "<=" / ">=": `paper` is a bound.
    relation: Literal["~", "<=", ">="] = "~"


@dataclass(frozen=True)
class Row:
    """A fact with lmedge's value and the distance (None where not applicable)."""

    fact: Fact
    value: float | None

    @property
    def delta(self) -> float | None:
        return None if self.value is None else self.value - self.fact.paper

    @property
    def relative(self) -> float | None:
        if self.value is None or self.fact.paper == 0:
            return None
        return (self.value - self.fact.paper) / self.fact.paper

    @property
    def holds(self) -> bool | None:
        """For a bound, whether lmedge's value keeps it; None for a "~" fact or no value."""
        if self.value is None or self.fact.relation == "~":
            return None
        if self.fact.relation == "<=":
            return self.value <= self.fact.paper
        return self.value >= self.fact.paper

    def as_dict(self) -> dict[str, Any]:
        f = self.fact
        return {
            "key": f.key,
            "fact": f.text,
            "source": f.source,
            "run": f.run,
            "unit": f.unit,
            "relation": f.relation,
            "paper": f.paper,
            "lmedge": self.value,
            "delta": self.delta,
            "relative": self.relative,
            "holds": self.holds,
        }


def paper_lm(ctx: ClusterContext, label: str) -> str | None:
    """The scenario's LM that plays the paper's `label` (LM1..LM4), by model id."""
    key = PAPER_MODELS[label]
    return next((s.name for s in ctx.services if model_key(s.spec.model) == key), None)


def _success_ratio(m: Measured, lm: str | None) -> float | None:
    pool = m.of(lm)
    return sum(r.success for r in pool) / len(pool) if pool else None


def _mean_latency(m: Measured, lm: str | None) -> float | None:
    ok = m.successes(lm)
    return statistics.fmean(r.latency_s for r in ok) if ok else None


def _lm_mean(ctx: ClusterContext, m: Measured) -> float | None:
    """The LM-mean latency of the pooled requests (`lmedge.metrics.lm_mean_latency`)."""
    values = []
    for lm in sorted({r.lm for r in m.requests}):
        mean = _mean_latency(m, lm)
        values.append(
            mean
            if mean is not None
            else ctx.deadline_s(lm)
            if ctx.has_service(lm)
            else ctx.loop.tau_s
        )
    return statistics.fmean(values) if values else None


def _per_lm(label: str, kind: str, run_name: str) -> Callable[..., float | None]:
    def measure(ctx: ClusterContext, runs: dict[str, Measured]) -> float | None:
        lm = paper_lm(ctx, label)
        if lm is None:
            return None
        m = runs[run_name]
        return _success_ratio(m, lm) if kind == "success" else _mean_latency(m, lm)

    return measure


def _gpu_seconds(ctx: ClusterContext, label: str) -> float | None:
    lm = paper_lm(ctx, label)
    return None if lm is None else ctx.service(lm).spec.profile.gpu_seconds_per_prompt


def _ratio_lm2_lm1(ctx: ClusterContext, _: dict[str, Measured]) -> float | None:
    a, b = _gpu_seconds(ctx, "LM2"), _gpu_seconds(ctx, "LM1")
    return None if a is None or b is None else a / b


def _milp_bound_share(label: str, latency: float) -> Callable[..., float | None]:
    """LM's GPU seconds per prompt as a share of MILP's mean latency per prompt."""

    def measure(ctx: ClusterContext, _: dict[str, Measured]) -> float | None:
        s = _gpu_seconds(ctx, label)
        return None if s is None else s / (latency / MEAN_PROMPTS)

    return measure


def _pre_median(_: ClusterContext, runs: dict[str, Measured]) -> float | None:
    ok = runs["pre"].successes()
    return statistics.median(r.latency_s for r in ok) if ok else None


def _pre_within_30(_: ClusterContext, runs: dict[str, Measured]) -> float | None:
    ok = runs["pre"].successes()
    return sum(r.latency_s <= 30.0 for r in ok) / len(ok) if ok else None


def _pre_count(_: ClusterContext, runs: dict[str, Measured]) -> float | None:
    return float(len(runs["pre"].successes())) / len(runs["pre"].seeds)


def _rr_within_tau(_: ClusterContext, runs: dict[str, Measured]) -> float | None:
    reqs = runs["rr"].requests
    return sum(r.success for r in reqs) / len(reqs) if reqs else None


MILP_LATENCY = {"LM1": 8.0, "LM2": 12.6, "LM3": 7.2, "LM4": 877.7}
MILP_SUCCESS = {"LM1": 1.000, "LM2": 1.000, "LM3": 1.000, "LM4": 0.192}

FACTS: tuple[Fact, ...] = (
    Fact(
        "static.lm2_over_lm1_gpu",
        "LM2 / LM1 GPU s per prompt",
        "§V-B",
        "static",
        1.0,
        "x",
        _ratio_lm2_lm1,
        ">=",
    ),
    *(
        Fact(
            f"static.{lab.lower()}_gpu_share_of_milp",
            f"{lab} GPU s per prompt / MILP's ({lat} s / {MEAN_PROMPTS})",
            "§VI-A",
            "static",
            1.0,
            "x",
            _milp_bound_share(lab, lat),
            "<=",
        )
        for lab, lat in MILP_LATENCY.items()
        if lab != "LM4"
    ),
    Fact(
        "static.lm4_gpu_seconds",
        "LM4 GPU s per prompt (30 / 3.02)",
        "§VI",
        "static",
        round(30.0 / 3.02, 2),
        "s",
        lambda ctx, _: _gpu_seconds(ctx, "LM4"),
    ),
    Fact(
        "pre.successes",
        "pre: successes per seed",
        "§V-D2",
        "pre",
        344.0,
        "req",
        _pre_count,
    ),
    Fact(
        "pre.median_latency",
        "pre: median latency",
        "§V-D2",
        "pre",
        9.76,
        "s",
        _pre_median,
    ),
    Fact(
        "pre.within_30s",
        "pre: successes within 30 s",
        "§V-D2",
        "pre",
        0.8372,
        "",
        _pre_within_30,
    ),
    Fact(
        "rr.within_tau",
        "rr: success within tau",
        "§V-D2",
        "rr",
        0.673,
        "",
        _rr_within_tau,
    ),
    *(
        Fact(
            f"milp.{lab.lower()}_{kind}",
            f"milp: {lab} {'success' if kind == 'success' else 'latency'}",
            "§VI-A, Fig. 7",
            "milp",
            MILP_SUCCESS[lab] if kind == "success" else MILP_LATENCY[lab],
            "" if kind == "success" else "s",
            _per_lm(lab, kind, "milp"),
        )
        for lab in ("LM1", "LM2", "LM3", "LM4")
        for kind in ("success", "latency")
    ),
    Fact(
        "milp.lm_mean_latency",
        "milp: LM-mean latency",
        "§VI-A, Fig. 6",
        "milp",
        226.6,
        "s",
        lambda ctx, runs: _lm_mean(ctx, runs["milp"]),
    ),
    Fact(
        "ma.lm4_success",
        "ma: LM4 success",
        "§VI-A, Fig. 7",
        "ma",
        0.479,
        "",
        _per_lm("LM4", "success", "ma"),
    ),
    Fact(
        "ma.lm4_latency",
        "ma: LM4 latency (about)",
        "§VI-A, Fig. 7",
        "ma",
        339.0,
        "s",
        _per_lm("LM4", "latency", "ma"),
    ),
)


@dataclass(frozen=True)
class CheckSpec:
    """What to run: the scenario, seeds, slots of the long runs and the pre-benchmark."""

    scenario: Path
    seeds: tuple[int, ...] = (1, 2, 3)
    slots: int = 200
    pre_slots: int = PRE_SLOTS
    pre_policy: str = PRE_POLICY
    workers: int = 1

    def runs(self) -> dict[str, tuple[str, int]]:
        """Reference run name -> (profile, slots)."""
        out = {"pre": (self.pre_policy, self.pre_slots)}
        out.update({p: (p, self.slots) for p in REFERENCE_POLICIES})
        return out


def measure_run(scenario: Path, policy: str, seed: int, slots: int) -> list[Request]:
    """One reference run (no store); module-level so a process pool can pickle it."""
    outcome = run(RunSpec(scenario, PolicyChoice(policy), seed, slots, keep_history=True))
    return [
        Request(r.lm, r.outcome == "success", r.latency_s)
        for r in outcome.result.measured_records()
    ]


def _jobs(spec: CheckSpec) -> list[tuple[str, str, int, int]]:
    return [
        (name, policy, seed, slots)
        for name, (policy, slots) in spec.runs().items()
        for seed in spec.seeds
    ]


def check(
    spec: CheckSpec,
    on_done: Callable[[int, int], None] | None = None,
    setup: Setup | None = None,
) -> list[Row]:
    """Run the reference conditions and measure every fact (see the module docstring).

    `setup` runs once in each worker process of the pool (`spec.workers > 1`)
    before its first run: what fills its plugin catalog (`register_plugins`).
    """
    if not spec.seeds:
        raise ConfigError("--seeds needs at least one seed")
    if spec.slots < 1 or spec.pre_slots < 1 or spec.workers < 1:
        raise ConfigError("--slots, --pre-slots and --workers must be at least 1")
    ctx = load_scenario(spec.scenario).context()
    jobs = _jobs(spec)
    done: list[list[Request]] = [[] for _ in jobs]
    if spec.workers == 1:
        for i, (_, policy, seed, slots) in enumerate(jobs):
            done[i] = measure_run(spec.scenario, policy, seed, slots)
            if on_done:
                on_done(i + 1, len(jobs))
    else:
        mp = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(
            max_workers=spec.workers, mp_context=mp, initializer=setup
        ) as pool:
            futures = [
                pool.submit(measure_run, spec.scenario, policy, seed, slots)
                for _, policy, seed, slots in jobs
            ]
            for i, fut in enumerate(futures):
                done[i] = fut.result()
                if on_done:
                    on_done(i + 1, len(jobs))
    runs: dict[str, Measured] = {}
    for name, (policy, slots) in spec.runs().items():
        pooled = [r for (n, *_), reqs in zip(jobs, done, strict=True) if n == name for r in reqs]
        runs[name] = Measured(policy, slots, spec.seeds, tuple(pooled))
    return [Row(f, f.measure(ctx, runs)) for f in FACTS]


def rows_json(spec: CheckSpec, rows: Sequence[Row]) -> dict[str, Any]:
    """The report as one JSON-ready object."""
    return {
        "scenario": str(spec.scenario),
        "seeds": list(spec.seeds),
        "runs": {name: {"policy": p, "slots": s} for name, (p, s) in spec.runs().items()},
        "facts": [r.as_dict() for r in rows],
    }
