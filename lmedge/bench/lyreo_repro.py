"""`lmedge reproduce --paper lyreo`: LYREO's §V results regenerated on lmedge's emulator.

Two kinds of work feed the evaluation (`lmedge.bench.lyreo_evaluation`):

- **runs** of the profiles on `examples/lyreo` (a `RunExecutor`: a process pool
  or Ray), one `Cell` per setting: the base setting (mix moderate, the
  scenario's users and servers) with every method (Fig. 3, Table II), the
  other two hardware mixes (Fig. 6), user counts (Fig. 4, the scenario's
  `workload.users.count` overridden), server counts (Fig. 5, the scenario's
  `nodes` overridden with `nodes-servers-N.yaml`) and the latency weight nu
  of `lyreo` (Fig. 7a, the router parameter `nu`);
- **trainings** (`lmedge.bench.training.train`, in this process, before the
  runs) of lyreo / ly-ppo / ppo-fixed for the convergence curves (Fig. 2) and
  of lyreo at each truncation H (Fig. 7b), at a tiny size (`LyreoOptions`).
  Without torch (the `lyreo` extra) they are skipped and their sections say
  why.

The runs use each learned profile's *shipped* policy, or its fallback to
`lyreo-ly` when none ships (`policy_sources` says which). The tiny trainings
are for the curves only: they are not the shipped policies.

Reduced size (what differs from the paper's §V-A): `slots` measured slots a
run (paper: 800), `seeds` evaluation runs per setting, `episodes` x
`train_slots` per training, four points per sweep.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from lmedge.bench import lyreo_paper
from lmedge.bench.checks import Section
from lmedge.bench.papers import Flags, Progress
from lmedge.bench.runner import RunData, RunExecutor, RunSpec, resolve_scenario
from lmedge.controller.assembly import PolicyChoice
from lmedge.errors import ConfigError
from lmedge.sim import load_scenario

#: The scenario of the paper's setting (its folder has the other mixes and the node files).
SCENARIO = "lyreo"
#: Methods of the scaling sweeps (Figs. 4-5): the learned schedulers and the paper's baselines.
SWEEP_METHODS: tuple[str, ...] = (
    "lyreo",
    "ly-ppo",
    "ppo-fixed",
    "static-batch",
    "ll-kv",
    "random-request",
)
#: Node files of the servers sweep, in the scenario folder (the base count is the scenario's own).
SERVERS_FILE = "nodes-servers-{n}.yaml"
#: Curve points averaged for "at convergence": the last third of the episodes (at least one).
CONVERGED_SHARE = 1 / 3

#: `--quick`: one seed, short runs and trainings, two points a sweep.
QUICK: dict[str, Any] = {
    "seeds": (1,),
    "slots": 30,
    "episodes": 2,
    "train_slots": 10,
    "users": (30, 60),
    "servers": (6, 8),
    "nus": (0.05, 2.0),
    "horizons": (50, 250, 300),
}


@dataclass(frozen=True)
class LyreoOptions:
    """What to run. Defaults are the documented reduced size (module docstring)."""

    seeds: tuple[int, ...] = (1, 2, 3)
    #: Measured slots per run (paper: 800).
    slots: int = 400
    quick: bool = False
    #: Restrict the methods (default: `lyreo_paper.METHODS`).
    policies: tuple[str, ...] | None = None
    #: Training episodes per curve (Fig. 2, Fig. 7b) and measured slots per episode.
    episodes: int = 8
    train_slots: int = 50
    #: Sweep points: users (Fig. 4), servers (Fig. 5), nu (Fig. 7a), H (Fig. 7b).
    users: tuple[int, ...] = (30, 60, 90, 120)
    servers: tuple[int, ...] = (4, 6, 8, 12)
    nus: tuple[float, ...] = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0)
    horizons: tuple[int, ...] = (50, 150, 250, 300)
    #: Run each grid run past its measured slots until every measured request has an
    #: outcome (`RunSpec.settle`); off only where a test needs the grid cheap, not correct.
    settle: bool = True

    def sized(self) -> LyreoOptions:
        """These options with `--quick`'s sizes applied (slots: the smaller)."""
        if not self.quick:
            return self
        return replace(self, **{**QUICK, "slots": min(self.slots, QUICK["slots"])})


@dataclass(frozen=True)
class Cell:
    """One setting of the grid: the runs of `policies` on one scenario variant."""

    key: str
    path: Path
    policies: tuple[str, ...]
    overrides: dict[str, Any] = field(default_factory=dict)
    #: Router parameters of every run of the cell (the nu sweep).
    router: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Training:
    """One tiny training: a curve of Fig. 2 or a point of Fig. 7b."""

    key: str
    variant: str
    horizon: int


@dataclass(frozen=True)
class Plan:
    """The cells and trainings of `options`, and where each figure's points are."""

    options: LyreoOptions
    cells: list[Cell]
    trainings: list[Training]
    #: figure -> [(point label, cell key)]: "mix", "users", "servers", "nu".
    axes: dict[str, list[tuple[str, str]]]
    #: "fig2" -> {variant: training key}, "h" -> {H: training key}.
    curves: dict[str, dict[str, str]]


@dataclass
class TrainingRun:
    """A finished training: its curve (`Episode`s as dicts) and its timing."""

    key: str
    curve: list[dict[str, Any]]
    timing: dict[str, Any]


@dataclass
class LyreoReproduction:
    """Everything `lmedge reproduce --paper lyreo` produced."""

    plan: Plan
    #: Runs with their cell key, in plan order.
    runs: list[tuple[str, RunData]]
    trainings: list[TrainingRun]
    #: Why the trainings did not run (None: they ran).
    training_skipped: str | None
    #: learned profile -> the policy its runs used (`policy_sources`).
    policies: dict[str, str]
    sections: list[Section] = field(default_factory=list)
    series: dict[str, Any] = field(default_factory=dict)

    @property
    def jobs(self) -> list[Any]:
        """Every run and training (each with `timing`), for the cost note."""
        return [r for _, r in self.runs] + list(self.trainings)


def _positive(values: Sequence[float], what: str) -> None:
    if not values:
        raise ConfigError(f"{what}: no point given")
    if any(v <= 0 for v in values):
        raise ConfigError(f"{what} must be positive, got {min(values)}")


def plan(options: LyreoOptions) -> Plan:
    """The grid for `options`; loads every scenario variant, so mistakes surface before any run."""
    o = options.sized()
    if o.slots < 1:
        raise ConfigError(f"--slots must be at least 1, got {o.slots}")
    if not o.seeds:
        raise ConfigError("--seeds names no seed")
    if len(set(o.seeds)) != len(o.seeds):
        raise ConfigError("--seeds names a seed twice")
    if o.episodes < 1 or o.train_slots < 1:
        raise ConfigError("training episodes and slots must be at least 1")
    for values, what in (
        (o.users, "users"),
        (o.servers, "servers"),
        (o.nus, "nu"),
        (o.horizons, "H"),
    ):
        _positive(values, what)
    wanted = o.policies if o.policies is not None else lyreo_paper.METHODS
    if not wanted:
        raise ConfigError("--policies names no policy")
    for p in wanted:
        PolicyChoice(p).resolve()  # an unknown name fails here, with the known ones listed
    methods = tuple(dict.fromkeys(wanted))
    sweep = tuple(p for p in SWEEP_METHODS if p in methods)
    base_path = resolve_scenario(SCENARIO)
    base = load_scenario(base_path)
    users0 = base.spec.workload.users.count if base.spec.workload.users else None
    servers0 = len([n for n in base.nodes if n.spec.role == "worker"])

    cells = [Cell("base", base_path, methods)]
    axes: dict[str, list[tuple[str, str]]] = {"mix": [], "users": [], "servers": [], "nu": []}
    for mix in lyreo_paper.MIXES:
        if mix == "moderate":  # the scenario's own mix
            axes["mix"].append((mix, "base"))
        else:
            cells.append(Cell(f"mix-{mix}", base_path / mix, methods))
            axes["mix"].append((mix, f"mix-{mix}"))
    for n in o.users:
        if n == users0:
            axes["users"].append((str(n), "base"))
        elif sweep:
            over: dict[str, Any] = {"workload": {"users": {"count": n}}}
            cells.append(Cell(f"users-{n}", base_path, sweep, over))
            axes["users"].append((str(n), f"users-{n}"))
    for n in o.servers:
        if n == servers0:
            axes["servers"].append((str(n), "base"))
        elif sweep:
            cells.append(
                Cell(f"servers-{n}", base_path, sweep, {"nodes": SERVERS_FILE.format(n=n)})
            )
            axes["servers"].append((str(n), f"servers-{n}"))
    if "lyreo" in methods:
        for nu in o.nus:
            cells.append(Cell(f"nu-{nu:g}", base_path, ("lyreo",), router={"nu": nu}))
            axes["nu"].append((f"{nu:g}", f"nu-{nu:g}"))
    for c in cells:
        load_scenario(c.path, **c.overrides)  # validate now, in this process

    default_h = _default_horizon()
    trainings = [Training(f"fig2-{v}", v, default_h) for v in lyreo_paper.LEARNED if v in methods]
    curves: dict[str, dict[str, str]] = {"fig2": {t.variant: t.key for t in trainings}, "h": {}}
    if "lyreo" in methods:
        for h in o.horizons:
            if h < 2:
                raise ConfigError(f"H must be at least 2, got {h}")
            key = "fig2-lyreo" if h == default_h else f"h-{h}"
            if h != default_h:
                trainings.append(Training(key, "lyreo", h))
            curves["h"][str(h)] = key
    return Plan(o, cells, trainings, axes, curves)


def _default_horizon() -> int:
    from lmedge.policies.lyreo.learning import LearnerParams

    return LearnerParams().horizon


def specs(p: Plan) -> list[tuple[str, RunSpec]]:
    """Every run of the plan with its cell key; the most loaded cells first (keeps a pool busy)."""
    out = [
        (
            c.key,
            RunSpec(
                c.path,
                PolicyChoice(pol, params={"router": dict(c.router)} if c.router else {}),
                seed,
                p.options.slots,
                settle=p.options.settle,
                overrides=c.overrides or None,
            ),
        )
        for c in p.cells
        for pol in c.policies
        for seed in p.options.seeds
    ]
    load = {"users": 2, "servers": 1}
    return sorted(out, key=lambda ks: -load.get(ks[0].split("-", 1)[0], 0))


def training_unavailable() -> str | None:
    """Why the trainings cannot run here (torch missing), or None."""
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed (the `lyreo` extra: `pip install 'lmedge[lyreo]'`)"
    return None


def policy_sources() -> dict[str, str]:
    """Which policy each learned profile routes with: the shipped file's provenance, or the
    fallback to `lyreo-ly` when the package ships none (`lmedge/policies/lyreo/learned.py`)."""
    from lmedge.policies.lyreo.learning import load_policy, shipped_policy

    out = {}
    for v in lyreo_paper.LEARNED:
        path = shipped_policy(v)  # type: ignore[arg-type]
        if not path.is_file():
            out[v] = "fallback: no shipped policy (routes as lyreo-ly)"
            continue
        pv = load_policy(path).provenance
        out[v] = (
            f"shipped {path.parent.name}/{path.name}: trained on {pv.scenario}, seed {pv.seed}, "
            f"{pv.episodes} episodes x {pv.slots} slots, commit {pv.commit[:12]}"
        )
    return out


def _train(p: Plan, t: Training, progress: Callable[[str], None]) -> TrainingRun:
    from lmedge.bench.training import train
    from lmedge.policies.lyreo.learning import LearnerParams

    o = p.options
    params = LearnerParams.model_validate({"variant": t.variant, "horizon": t.horizon})
    scenario = load_scenario(resolve_scenario(SCENARIO))
    cpu, wall = time.process_time(), time.perf_counter()
    policy = train(
        scenario,
        o.seeds[0],
        o.episodes,
        params,
        slots=o.train_slots,
        on_episode=lambda e, _: progress(f"train {t.key} episode {e.episode}"),
    )
    timing = {
        "wall_s": round(time.perf_counter() - wall, 3),
        "cpu_s": round(time.process_time() - cpu, 3),
    }
    return TrainingRun(t.key, [e.model_dump() for e in policy.curve], timing)


def reproduce(
    options: LyreoOptions, executor: RunExecutor, progress: Progress | None = None
) -> LyreoReproduction:
    """Train, run the grid with `executor`, and evaluate; `progress` hears each step."""
    from lmedge.bench.lyreo_evaluation import evaluate

    p = plan(options)
    keyed = specs(p)
    skipped = training_unavailable()
    trainings = [] if skipped else p.trainings
    total = len(keyed) + len(trainings) * p.options.episodes
    count = [0]

    def step(what: str) -> None:
        count[0] += 1
        if progress:
            progress(count[0], total, what)

    trained = [_train(p, t, step) for t in trainings]

    def done(i: int, data: RunData) -> None:
        s = data.summary
        step(f"{keyed[i][0]} {s['policy']} s{s['seed']}")

    datas = executor.map([s for _, s in keyed], done)
    cells = {c.key: (i, c.policies) for i, c in enumerate(p.cells)}

    def position(kr: tuple[str, RunData]) -> tuple[int, int, int]:
        i, pols = cells[kr[0]]
        s = kr[1].summary
        return i, pols.index(kr[1].spec.choice.profile or ""), s["seed"]

    runs = sorted(zip((k for k, _ in keyed), datas, strict=True), key=position)
    repro = LyreoReproduction(p, runs, trained, skipped, policy_sources())
    repro.sections, repro.series = evaluate(repro)
    return repro


class LyreoReproducer:
    """`lmedge reproduce --paper lyreo`: this module behind `lmedge.bench.papers`."""

    summary = "lyreo: LYREO's Figs. 2-7 and Table II on examples/lyreo"
    seeds = LyreoOptions.seeds
    slots = LyreoOptions.slots

    def options(self, flags: Flags) -> LyreoOptions:
        return LyreoOptions(flags.seeds, flags.slots, flags.quick, flags.policies)

    def check(self, flags: Flags) -> None:
        plan(self.options(flags))

    def run(self, flags: Flags, executor: RunExecutor, progress: Progress) -> LyreoReproduction:
        return reproduce(self.options(flags), executor, progress)

    def write(self, out: Path, result: Any, *, command: str, cpu_note: str) -> Path:
        from lmedge.bench import lyreo_report  # it imports this module

        return lyreo_report.write(out, result, command=command, cpu_note=cpu_note)


REPRODUCER = LyreoReproducer()
