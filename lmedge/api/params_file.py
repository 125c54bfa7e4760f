"""A policy-parameters file: plugin parameters per tier, written and read back.

`lmedge calibrate --params FILE` writes one; `lmedge simulate`, `lmedge bench`
and `lmedge controller` (the chart's `policy.paramsFile`) read it with
`--params FILE`. The format is YAML (JSON is YAML too)::

    # calibrated on testbed, profile al, seed 1
    plugins: {deployer: lyapunov}
    deployer:
      p1: 0.15
      alpha_gpu: {lm1: 5.8, lm2: 7.2}

Only the tiers `planner`, `router` and `deployer` may appear, plus an optional
`plugins` mapping naming the plugin each tier's parameters are for; each tier
maps parameter names to values that the tier's plugin validates when it is
built (an unknown name is refused there, naming the valid ones). Duplicate
keys, non-finite numbers and anything but one mapping are refused here, with
the file name in the message.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lmedge.api.manifests import load_yaml
from lmedge.errors import ConfigError

TIERS = ("planner", "router", "deployer")


def _finite(value: Any, where: str) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{where}: {value} is not a finite number")
    if isinstance(value, Mapping):
        for k, v in value.items():
            if not isinstance(k, str):
                raise ConfigError(f"{where}: key {k!r} is not a string")
            _finite(v, f"{where}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _finite(v, f"{where}[{i}]")


@dataclass(frozen=True)
class ParamsFile:
    """What a parameters file holds."""

    #: {tier: {name: value}}.
    params: dict[str, dict[str, Any]]
    #: {tier: plugin name} the parameters are for (empty: any plugin).
    plugins: dict[str, str] = field(default_factory=dict)

    def for_tiers(self, tiers: Mapping[str, str]) -> dict[str, dict[str, Any]]:
        """The parameters of every tier whose plugin in `tiers` is the one they are for."""
        return {
            t: dict(p)
            for t, p in self.params.items()
            if t not in self.plugins or self.plugins[t] == tiers.get(t)
        }

    def mismatches(self, tiers: Mapping[str, str]) -> list[str]:
        """'deployer is for lyapunov, not X' for every tier whose plugin differs."""
        return [
            f"{t} parameters are for {want!r}, not {tiers.get(t)!r}"
            for t, want in self.plugins.items()
            if t in self.params and tiers.get(t) != want
        ]


def parse_params(text: str, source: str) -> ParamsFile:
    """The parameters file in `text` (`ConfigError` naming `source` if invalid)."""
    try:
        docs = [d for d in load_yaml(text) if d is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" (line {mark.line + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{source}: not valid YAML{at}: {problem}") from None
    if len(docs) > 1:
        raise ConfigError(f"{source}: one document expected, found {len(docs)}")
    doc = docs[0] if docs else {}
    if not isinstance(doc, dict):
        raise ConfigError(
            f"{source}: expected a mapping of tiers ({', '.join(TIERS)}), got {type(doc).__name__}"
        )
    plugins = doc.pop("plugins", None) or {}
    if not isinstance(plugins, dict) or not all(
        t in TIERS and isinstance(n, str) and n for t, n in plugins.items()
    ):
        raise ConfigError(
            f"{source}: plugins must map tiers ({', '.join(TIERS)}) to plugin names, "
            f"got {plugins!r}"
        )
    out: dict[str, dict[str, Any]] = {}
    for tier, params in doc.items():
        if tier not in TIERS:
            raise ConfigError(f"{source}: {tier!r} is not a tier; expected {', '.join(TIERS)}")
        if params is None:
            params = {}
        if not isinstance(params, dict):
            raise ConfigError(
                f"{source}: {tier} must map parameter names to values, got {type(params).__name__}"
            )
        _finite(params, f"{source}: {tier}")
        out[tier] = dict(params)
    return ParamsFile(out, dict(plugins))


def read_params(path: Path) -> ParamsFile:
    """`parse_params` of the file at `path` (a missing or unreadable file is a `ConfigError`)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"--params: {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--params: cannot read {path}: {exc}") from None
    return parse_params(text, str(path))


def dump_params(
    params: Mapping[str, Mapping[str, Any]],
    plugins: Mapping[str, str] | None = None,
    header: str = "",
) -> str:
    """The YAML text `parse_params` reads back (with `header` as comments)."""
    comment = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
    body: dict[str, Any] = {"plugins": dict(plugins)} if plugins else {}
    body |= {t: dict(params[t]) for t in TIERS if params.get(t)}
    return comment + yaml.safe_dump(body, sort_keys=False, default_flow_style=False)


def merge_params(
    base: Mapping[str, Mapping[str, Any]], override: Mapping[str, Mapping[str, Any]]
) -> dict[str, dict[str, Any]]:
    """`base` with `override`'s parameters on top, tier by tier (flags over a file)."""
    out = {t: dict(p) for t, p in base.items()}
    for tier, params in override.items():
        out.setdefault(tier, {}).update(params)
    return {t: p for t, p in out.items() if p}
