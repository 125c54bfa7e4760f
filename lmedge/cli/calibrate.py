"""`lmedge calibrate`: estimate the Lyapunov deployer's weights and coefficients on a scenario.

1. A rates run (profile `al` by default: uniform routing spreads every LM over
   every node that can host it) records completions and per-slot snapshots;
   alpha_i^m = slot_s * completed prompts / busy seconds (paper §VI).
2. A deterministic log-space coordinate search over (p1, p2, lambda_churn,
   kappa) with the estimated alphas, each point measured on a validation
   window (a short emulator run on a different seed than the rates run);
   a move is accepted only if it improves J_cal by more than `--eps-acc`.
3. A noise diagnostic (the start point on a second validation seed) and a
   confirmation window (the final point on a third seed) are reported, not
   used for selection.

The result prints as a table and, with `--out`, is written as JSON whose
`deployer_params` can be passed to the `lyapunov` deployer as-is.

`--engine llama.cpp` calibrates a serving engine instead: a token profile for
llama.cpp's server on this machine, checked by replaying a trace on the server
and in the emulator (`lmedge.bench.engine_calibration`); `--out` is then a
folder (engine.yaml, comparison.json, comparison.md).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from lmedge.agents.local_llm import free_port, model_path
from lmedge.api import (
    ActuationResult,
    Arrival,
    ClusterBackend,
    ClusterContext,
    NodeTelemetry,
    Placement,
    RequestRecord,
    RoutingMap,
    Snapshot,
)
from lmedge.api.live import ContextUpdate
from lmedge.api.params_file import dump_params
from lmedge.bench import engine_calibration as ec
from lmedge.bench.llama_server import CLOCKS, ServerConfig, binary_path
from lmedge.bench.runner import emulated_backend, resolve_scenario, settle_slots
from lmedge.cli.console import ScenarioOpt
from lmedge.controller.assembly import PolicyChoice, build_plugins
from lmedge.controller.catalog import profile
from lmedge.controller.loop import ControlLoop, RunResult
from lmedge.errors import ConfigError
from lmedge.policies.lyapunov import default_alphas
from lmedge.policies.lyapunov.calibration import (
    COEFFICIENTS,
    SearchStep,
    calibration_objective,
    coordinate_search,
    service_rates,
)
from lmedge.processes.plugins import register_plugins
from lmedge.sim import Scenario, load_scenario

out = Console()


class _SnapshotTap:
    """A `ClusterBackend` that remembers every snapshot it hands out."""

    def __init__(self, inner: ClusterBackend) -> None:
        self.inner = inner
        self.clock = inner.clock
        self.snapshots: list[Snapshot] = []

    def context(self) -> ClusterContext:
        return self.inner.context()

    def refresh(self, slot: int) -> ContextUpdate:
        return self.inner.refresh(slot)

    def snapshot(self, slot: int) -> Snapshot:
        snap = self.inner.snapshot(slot)
        self.snapshots.append(snap)
        return snap

    def arrivals(self, slot: int) -> list[Arrival]:
        return self.inner.arrivals(slot)

    def publish_routing(self, slot: int, routing: RoutingMap) -> None:
        self.inner.publish_routing(slot, routing)

    def apply_placement(self, placement: Placement) -> ActuationResult:
        return self.inner.apply_placement(placement)

    def drain_records(self) -> list[RequestRecord]:
        return self.inner.drain_records()

    def telemetry(self) -> list[NodeTelemetry]:
        return self.inner.telemetry()

    def close(self) -> None:
        self.inner.close()


def _run(
    sc: Scenario, policy: str, seed: int, slots: int, params: Mapping[str, Any]
) -> tuple[RunResult, list[Snapshot]]:
    tap = _SnapshotTap(emulated_backend(sc, seed))
    ctx = tap.context()
    plugins = build_plugins(PolicyChoice(policy, params={"deployer": params}), ctx, seed)
    loop = ControlLoop(tap, plugins, run_id=f"calibrate-{seed}", seed=seed, telemetry=False)
    result = loop.run(slots, settle_slots=settle_slots(ctx))
    return result, tap.snapshots[:slots]


def _measured(result: RunResult) -> tuple[list[RequestRecord], list[Placement]]:
    placements = [
        p
        for p, t in zip(result.placements, result.placement_slots, strict=True)
        if t < result.slots
    ]
    return result.measured_records(), placements


def _calibrate_engine(
    engine: str,
    model: Path | None,
    server_bin: Path | None,
    out_dir: Path | None,
    seed: int,
    requests: int,
    threads: int,
    parallel: int,
    clock: str,
    loads: str,
) -> None:
    """`--engine llama.cpp`: measure, fit, replay, compare (see the module docstring)."""
    if engine != "llama.cpp":
        raise ConfigError(
            f"--engine must be llama.cpp (the engine that can be measured here), got {engine!r}"
        )
    if requests < 1 or threads < 1 or parallel < 1:
        raise ConfigError("--requests, --threads and --parallel must be at least 1")
    if clock not in CLOCKS:
        raise ConfigError(f"--clock must be one of {', '.join(CLOCKS)}, got {clock!r}")
    try:
        load_list = [float(x) for x in loads.split(",") if x.strip()]
    except ValueError as exc:
        raise ConfigError(f"--loads must be comma-separated numbers, got {loads!r}") from exc
    if not load_list or any(not x > 0 for x in load_list):
        raise ConfigError(f"--loads must be positive numbers, got {loads!r}")
    out_dir = out_dir or Path("calibration-llama.cpp")
    config = ServerConfig(parallel=parallel, threads=threads)
    trace = ec.TraceSpec(requests=requests, seed=seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    result = ec.calibrate(
        server_bin or binary_path(),
        model or model_path(),
        config,
        trace,
        out_dir / "llama-server.log",
        free_port(),
        clock=clock,
        loads=load_list,
        on_phase=lambda msg: out.print(f"[bold]{msg}[/bold]"),
    )
    cpu = result.tokens.cpu
    assert cpu is not None
    out.print(
        f"prefill {cpu.prefill_tokens_per_s:.0f} tokens/s; decode "
        + ", ".join(f"{p.running}: {p.tokens_per_s:.1f}" for p in cpu.decode)
        + " tokens/s (running: aggregate)"
    )
    for r in result.replays:
        out.print(
            f"replay at {r.load:g}x capacity in ON periods (re-timed level: prefill"
            f" x{r.level[0]:.2f}, decode x{r.level[1]:.2f}):"
        )
        out.print(ec.markdown_table(r.rows))
    for path in ec.write_result(result, out_dir):
        out.print(f"wrote {path}")


def register(app: typer.Typer) -> None:
    @app.command("calibrate")
    def calibrate(
        scenario: ScenarioOpt = "testbed",
        policy: str = typer.Option(
            "al", "--policy", "-p", help="Profile whose deployer is lyapunov (al, rl, ll, ...)."
        ),
        seed: int = typer.Option(
            1, min=0, help="Seed of the rates run (>= 0); validation uses seed+1.."
        ),
        rate_slots: int = typer.Option(30, help="Slots of the service-rate run."),
        window_slots: int = typer.Option(12, help="Slots of each validation window."),
        radii: str = typer.Option("2", help="Comma-separated search radii, e.g. 4,2,1.5."),
        eps_acc: float = typer.Option(0.01, help="Acceptance margin on J_cal."),
        start: float = typer.Option(1.0, help="Generic positive start for every coefficient."),
        out_path: str | None = typer.Option(None, "--out", "-o", help="Write the result as JSON."),
        params_path: Annotated[
            Path | None,
            typer.Option(
                "--params",
                help="Write the calibrated deployer parameters as a file that `simulate`, "
                "`bench` and `controller` read back with --params (chart: policy.paramsFile).",
            ),
        ] = None,
        engine: Annotated[
            str | None,
            typer.Option(
                "--engine",
                help="Calibrate a serving engine instead (llama.cpp): a token profile measured "
                "on llama-server and its emulator error on a replayed trace; --out is a folder.",
            ),
        ] = None,
        model: Annotated[
            Path | None, typer.Option("--model", help="--engine: the GGUF model.")
        ] = None,
        server_bin: Annotated[
            Path | None, typer.Option("--server-bin", help="--engine: the llama-server binary.")
        ] = None,
        requests: int = typer.Option(120, help="--engine: requests in the replayed trace."),
        threads: int = typer.Option(
            1, help="--engine: llama-server CPU threads (--threads and --threads-batch)."
        ),
        parallel: int = typer.Option(4, help="--engine: llama-server slots (running sequences)."),
        clock: str = typer.Option(
            "cpu",
            help="--engine: time the server by its model thread's CPU time while it has work "
            "(cpu: a shared machine; needs --threads 1) or by the wall clock (wall: a quiet "
            "machine of its own).",
        ),
        loads: str = typer.Option(
            ",".join(f"{x:g}" for x in ec.LOADS),
            help="--engine: the replays' loads, comma-separated: what an ON period offers, "
            "as a multiple of what the calibrated engine serves.",
        ),
    ) -> None:
        """Estimate service-rate weights, then coordinate-search the DPP coefficients.

        With --engine llama.cpp: calibrate llama.cpp's token profile instead.
        """
        if engine is not None:
            out_dir = Path(out_path) if out_path is not None else None
            _calibrate_engine(
                engine, model, server_bin, out_dir, seed, requests, threads, parallel, clock, loads
            )
            return
        register_plugins()
        if profile(policy).deployer != "lyapunov":
            raise ConfigError(f"profile {policy!r} does not use the lyapunov deployer")
        try:
            radius_list = [float(r) for r in radii.split(",") if r.strip()]
        except ValueError as exc:
            raise ConfigError(f"--radii must be numbers, got {radii!r}") from exc
        if not radius_list or any(r <= 1 for r in radius_list):
            raise ConfigError("--radii must be numbers greater than 1")
        if start <= 0 or rate_slots < 1 or window_slots < 1:
            raise ConfigError("--start, --rate-slots and --window-slots must be positive")
        sc = load_scenario(resolve_scenario(scenario))
        ctx = sc.context()

        out.print(f"[bold]1. service rates[/bold] ({policy}, {rate_slots} slots, seed {seed})")
        result, snaps = _run(sc, policy, seed, rate_slots, {})
        rates = service_rates(result.measured_records(), snaps, ctx.loop.slot_s)
        # The defaults the lyapunov deployer uses: the paper's fixed weights.
        prior_gpu, prior_cpu = default_alphas(ctx.services, ctx.loop.slot_s)
        table = Table("LM", "mode", "prompts done", "busy s", "alpha (est.)", "alpha (paper)")
        for lm in ctx.lm_names:
            for mode, est, prior in (
                ("gpu", rates.alpha_gpu, prior_gpu),
                ("cpu", rates.alpha_cpu, prior_cpu),
            ):
                if (lm, mode) in rates.busy_s or prior[lm] > 0:
                    table.add_row(
                        lm,
                        mode,
                        str(rates.completed.get((lm, mode), 0)),
                        f"{rates.busy_s.get((lm, mode), 0.0):.0f}",
                        f"{est[lm]:.2f}" if lm in est else "-",
                        f"{prior[lm]:.2f}",
                    )
        out.print(table)
        alpha_gpu = {lm: rates.alpha_gpu.get(lm, prior_gpu[lm]) for lm in ctx.lm_names}
        alpha_cpu = {lm: rates.alpha_cpu.get(lm, prior_cpu[lm]) for lm in ctx.lm_names}

        def params(x: Mapping[str, float]) -> dict[str, Any]:
            return {"p0": 0.0, **x, "alpha_gpu": alpha_gpu, "alpha_cpu": alpha_cpu}

        def window(x: Mapping[str, float], s: int) -> float:
            res, _ = _run(sc, policy, s, window_slots, params(x))
            records, placements = _measured(res)
            return calibration_objective(records, placements, ctx.lm_names, ctx.loop.tau_s)

        out.print(
            f"[bold]2. coordinate search[/bold] over {', '.join(COEFFICIENTS)}: radii "
            f"{radius_list}, eps_acc {eps_acc}, windows of {window_slots} slots (seed {seed + 1})"
        )
        steps = Table("radius", "coef", "value", "J", "J x r", "J / r", "kept")

        def show(step: SearchStep) -> None:
            steps.add_row(
                f"{step.radius:g}",
                step.coefficient,
                f"{step.current:.4g}",
                f"{step.j_current:.4f}",
                f"{step.j_up:.4f}",
                f"{step.j_down:.4f}",
                step.accepted,
            )

        x0 = dict.fromkeys(COEFFICIENTS, start)
        search = coordinate_search(
            lambda x: window(x, seed + 1), x0, radius_list, eps_acc, on_step=show
        )
        out.print(steps)
        noise = abs(window(x0, seed + 2) - search.j_start)
        confirm = window(search.final, seed + 3)
        out.print(
            f"[bold]3. result[/bold] J_cal {search.j_start:.4f} -> {search.j_final:.4f} "
            f"({search.evaluations} windows); noise |J(start, seed {seed + 2}) - "
            f"J(start, seed {seed + 1})| = {noise:.4f}; confirmation J (seed {seed + 3}) = "
            f"{confirm:.4f}"
        )
        final = {k: round(v, 6) for k, v in search.final.items()}
        out.print("coefficients: " + ", ".join(f"{k}={v:g}" for k, v in final.items()))
        payload = {
            "scenario": sc.name,
            "policy": policy,
            "seed": seed,
            "deployer_params": params(final),
            "j_start": search.j_start,
            "j_final": search.j_final,
            "noise": noise,
            "confirmation": confirm,
            "trajectory": [asdict(s) for s in search.steps],
        }
        if out_path is not None:
            Path(out_path).write_text(json.dumps(payload, indent=2) + "\n")
            out.print(f"wrote {out_path}")
        if params_path is not None:
            header = (
                f"lmedge calibrate -f {scenario} -p {policy} --seed {seed}: the lyapunov "
                f"deployer's parameters on {sc.name}\nJ_cal {search.j_start:.4f} -> "
                f"{search.j_final:.4f}; confirmation J (seed {seed + 3}) {confirm:.4f}\n"
                f"Use: lmedge simulate -p {policy} --params {params_path.name}"
            )
            text = dump_params({"deployer": params(final)}, {"deployer": "lyapunov"}, header)
            params_path.write_text(text)
            out.print(f"wrote {params_path}")
