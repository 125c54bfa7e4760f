"""The plugin catalog and the capabilities plugins declare.

A family of plugins that fails to import must cost that family only, be
reported, and never leave the catalog empty; the catalog never fills itself
(a lookup before the root registered is a clear error, and registering twice
changes nothing); a joint router+deployer (milp)
runs where both live in one process and is refused, saying why, where the
deployers run in node agents.
"""

from __future__ import annotations

import logging

import pytest

from lmedge.api import Capabilities, ClusterContext, capabilities_of
from lmedge.controller import catalog, registrations
from lmedge.controller.assembly import PolicyChoice, build_node_deployer, build_plugins
from lmedge.controller.catalog import CatalogNotFilled, Registry, fill
from lmedge.errors import ConfigError
from lmedge.processes.plugins import register_plugins


def _broken(reg: Registry) -> None:
    reg.add_router("half-registered", lambda b: None, "registered before the import fails")  # type: ignore[arg-type, return-value]
    import lmedge_no_such_module  # type: ignore[import-not-found]  # noqa: F401


def test_a_failing_family_is_reported_and_the_rest_registers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    families = (("broken", _broken), *registrations.FAMILIES)
    target, unavailable = Registry(), {}
    with caplog.at_level(logging.WARNING):
        fill(target, unavailable, families, registrations.register_profiles)
    assert "broken" in unavailable and "lmedge_no_such_module" in unavailable["broken"]
    assert "half-registered" not in target.routers, "a family registers whole or not at all"
    assert {"agentic", "random", "milp"} <= set(target.routers)
    assert {"ma", "rr", "milp"} <= set(target.profiles)
    assert any("broken" in r.getMessage() for r in caplog.records)


def test_a_profile_whose_plugin_failed_is_left_out_and_said_so() -> None:
    families = tuple((n, f) for n, f in registrations.FAMILIES if n != "lyapunov")
    target, unavailable = Registry(), {}
    fill(target, unavailable, families, registrations.register_profiles)
    assert "rl" not in target.profiles and "ma" in target.profiles
    assert "deployer lyapunov" in unavailable["profile rl"]


def test_an_unknown_name_names_what_did_not_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(catalog.UNAVAILABLE, "cema", "ImportError: no module named 'x'")
    with pytest.raises(ConfigError, match=r"known routers: .*not loaded: cema \(ImportError"):
        catalog.entry("router", "cema-typo")


@pytest.mark.parametrize(
    "lookup",
    [
        lambda: catalog.profile("rr"),
        lambda: catalog.entry("router", "random"),
        lambda: PolicyChoice("rr").resolve(),
    ],
    ids=["profile", "entry", "assembly"],
)
def test_a_lookup_before_registration_says_the_root_must_register(
    monkeypatch: pytest.MonkeyPatch, lookup: object
) -> None:
    monkeypatch.setattr(catalog, "_filled", False)  # as in a process whose root registered none
    with pytest.raises(CatalogNotFilled, match=r"must call .*register_plugins\(\)"):
        lookup()  # type: ignore[operator]


def test_registering_again_changes_nothing() -> None:
    before = {kind: dict(table) for kind, table in _tables().items()}
    register_plugins()
    assert catalog.filled()
    assert {kind: dict(table) for kind, table in _tables().items()} == before


def _tables() -> dict[str, dict[str, object]]:
    return {
        "planners": dict(catalog.PLANNERS),
        "routers": dict(catalog.ROUTERS),
        "deployers": dict(catalog.DEPLOYERS),
        "profiles": dict(catalog.PROFILES),
    }


def test_the_filled_catalog_has_every_family() -> None:
    assert catalog.UNAVAILABLE == {}
    assert {"ma", "rr", "rf", "ll", "milp", "cema", "lyreo", "perllm", "mal"} <= set(
        catalog.PROFILES
    )


def test_capabilities_are_declared_not_probed(ctx: ClusterContext) -> None:
    cema = build_plugins(PolicyChoice("cema"), ctx, 1)
    assert capabilities_of(cema.router).routes_request_classes
    rr = build_plugins(PolicyChoice("rr"), ctx, 1)
    assert capabilities_of(rr.router) == Capabilities()
    milp = build_plugins(PolicyChoice("milp"), ctx, 1)
    deployer = next(iter(milp.deployers.values()))
    assert capabilities_of(deployer).joint_router == "milp"
    assert catalog.entry("deployer", "milp").capabilities == capabilities_of(deployer)


def test_milp_deployers_read_their_own_routers_plan(ctx: ClusterContext) -> None:
    # Two runs on the same context object: each deployer reads its own run's
    # router (the process-global board handed the newest router's plan to all).
    first = build_plugins(PolicyChoice("milp"), ctx, 1)
    second = build_plugins(PolicyChoice("milp"), ctx, 2)
    for p in (first, second):
        for d in p.deployers.values():
            assert d.plan is p.router.plan  # type: ignore[attr-defined]


def test_a_joint_profile_is_refused_for_a_cluster_saying_why(ctx: ClusterContext) -> None:
    with pytest.raises(ConfigError, match=r"the milp deployer .* node agents"):
        build_plugins(PolicyChoice("milp"), ctx, 1, deployers_in_process=False)
    with pytest.raises(ConfigError, match=r"the milp deployer .* node agents"):
        build_node_deployer(PolicyChoice("milp"), ctx, "worker-2", 1)
    remote = build_plugins(PolicyChoice("ma"), ctx, 1, deployers_in_process=False)
    assert remote.deployers == {}
    assert build_node_deployer(PolicyChoice("ma"), ctx, "worker-2", 1).name == "agentic"


def test_a_gateway_builds_the_runs_request_router_and_the_seed_from_the_catalog(
    ctx: ClusterContext,
) -> None:
    from lmedge.api import RequestRouter
    from lmedge.api.runconfig import PolicyConfig
    from lmedge.controller.assembly import (
        SEED_ROUTER,
        build_gateway_router,
        build_seed_router,
    )

    register_plugins()
    config = PolicyChoice("cema-request").config(seed=3)
    router = build_gateway_router(config, ctx, "worker-1")
    assert isinstance(router, RequestRouter) and capabilities_of(router).routes_requests
    seed = build_seed_router(config, ctx, "worker-1")
    assert isinstance(seed, RequestRouter) and seed.p.method == "seed"  # type: ignore[attr-defined]
    assert SEED_ROUTER == "cema-seed"
    # LYREO's routers fall back on the least KV memory-time, the signal they route on
    kv = build_seed_router(PolicyChoice("lyreo-ly").config(seed=3), ctx, "worker-1")
    assert isinstance(kv, RequestRouter) and capabilities_of(kv).routes_requests
    assert type(kv).__name__ == "LeastLoadedRouter" and kv.name == "ll-kv"  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="does not route requests one by one"):
        build_gateway_router(PolicyConfig(profile="ma"), ctx, "worker-1")


def test_a_profile_gives_its_own_plugins_its_parameters(ctx: ClusterContext) -> None:
    # ma's planner follows the traffic; mal shares the planner and keeps it off.
    reads = lambda choice: capabilities_of(build_plugins(choice, ctx, 1).planner).reads_traffic  # noqa: E731
    assert reads(PolicyChoice("ma"))
    assert not reads(PolicyChoice("mal"))
    # A run's own parameter wins over the profile's.
    assert not reads(PolicyChoice("ma", params={"planner": {"follow_traffic": False}}))
    assert reads(PolicyChoice("mal", params={"planner": {"follow_traffic": True}}))
    # A tier overridden with another plugin does not get the profile's parameters.
    assert PolicyChoice("ma", planner="static").resolve().params == {}
    assert PolicyChoice("rr", params={"router": {"x": 1}}).resolve().params == {"router": {"x": 1}}
    assert PolicyChoice("ma").resolve().params == {"planner": {"follow_traffic": True}}
