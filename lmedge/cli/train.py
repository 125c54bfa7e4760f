"""`lmedge train lyreo`: train LYREO's PPO scheduler in the emulator and write its policy file.

    lmedge train lyreo -f SCENARIO --seed S --episodes N -o policy.json [--variant V]
                       [--param KEY=VALUE ...] [--slots T]

Hyperparameters are `LearnerParams` (`--param horizon=250`); a bad key or
value is one line on stderr naming it. Training needs the `lyreo` extra
(torch); using the file (`--router-param policy=policy.json`, or shipping it
as `lmedge/policies/lyreo/trained/<variant>.json`) does not. The bar shows the
episodes; each finished episode prints its curve point on stderr and
rewrites the policy file, so a training stopped early keeps its latest actor.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from lmedge.bench.runner import resolve_scenario
from lmedge.cli.console import ScenarioOpt, err, progress_bar
from lmedge.errors import ConfigError
from lmedge.policies.kit.params import parse_params
from lmedge.policies.lyreo.learning import Episode, LearnerParams, PolicyFile, save_policy
from lmedge.sim import load_scenario


def _learner_params(variant: str, given: list[str] | None) -> LearnerParams:
    values: dict[str, str] = {"variant": variant}
    for item in given or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--param takes KEY=VALUE, got {item!r}")
        values[key.strip()] = value.strip()
    return parse_params(LearnerParams, values, "lmedge train lyreo")


def register(app: typer.Typer) -> None:
    group = typer.Typer(help="Train a learned policy in the emulator.", no_args_is_help=True)
    app.add_typer(group, name="train")

    @group.command("lyreo")
    def lyreo(
        scenario: ScenarioOpt,
        out: Annotated[Path, typer.Option("--out", "-o", help="The policy file to write.")],
        seed: Annotated[
            int, typer.Option(help="Training seed (episode seeds derive from it).")
        ] = 1,
        episodes: Annotated[int, typer.Option(help="Emulated runs to learn from.")] = 20,
        slots: Annotated[
            int | None, typer.Option(help="Slots per episode (default: the scenario's).")
        ] = None,
        variant: Annotated[
            str, typer.Option(help="lyreo, ly-ppo (no redistribution) or ppo-fixed (no Z).")
        ] = "lyreo",
        param: Annotated[
            list[str] | None,
            typer.Option("--param", help="A hyperparameter, KEY=VALUE (repeatable)."),
        ] = None,
    ) -> None:
        """Train LYREO (or an ablation) and write the policy with its provenance and curve."""
        from lmedge.bench.training import train
        from lmedge.processes.plugins import register_plugins

        params = _learner_params(variant, param)
        register_plugins()
        sc = load_scenario(resolve_scenario(scenario))
        with progress_bar(terminal_only=False) as bar:
            task = bar.add_task(f"train {params.variant} on {sc.name}", total=episodes)

            def done(e: Episode, so_far: PolicyFile) -> None:
                save_policy(so_far, out)  # a stopped training keeps its latest policy
                bar.advance(task)
                err.print(
                    f"episode {e.episode}: latency {e.mean_latency_s:.2f} s, "
                    f"failures {e.failure_share:.3f}, Z {e.mean_z:.3f}, cost {e.mean_cost:.4f}"
                )

            policy = train(sc, seed, episodes, params, slots=slots, on_episode=done)
        save_policy(policy, out)
        err.print(f"wrote {escape(str(out))}")
