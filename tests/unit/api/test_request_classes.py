"""Request classes served by several LMs: context helpers and routing-map feasibility.

In this cluster `txt` and `gen` declare `serves: [chat]` and `img` declares
`serves: [vision]`; `big` serves only itself. Each routing case edits a
feasible map in one way and lists every violation expected.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from lmedge.api import (
    Arrival,
    ClusterContext,
    Route,
    RoutingMap,
    check_routing_map,
)
from lmedge.api.schema import strict_json_schema
from tests.unit.api.conftest import NODES, service
from tests.unit.api.test_feasibility import Expected, assert_violations

SERVICES = [
    service("txt", "cpu-or-gpu", 3.0, 1.0, serves=["chat"], quality=0.6),
    service("big", "cpu-or-gpu", 9.0, 3.5),
    service("img", "gpu-only", 2.5, 2.0, serves=["vision"]),
    service("gen", "gpu-only", 3.5, 6.0, maxVgpus=2, serves=["chat"], quality=0.9),
]


@pytest.fixture
def classes_ctx() -> ClusterContext:
    return ClusterContext(nodes=NODES, services=SERVICES)


def test_request_classes_are_lm_names_then_served_classes(classes_ctx: ClusterContext) -> None:
    assert classes_ctx.request_classes == ["txt", "big", "img", "gen", "chat", "vision"]


@pytest.mark.parametrize(
    ("cls", "models", "default"),
    [
        ("chat", ["txt", "gen"], "txt"),
        ("vision", ["img"], "img"),
        ("big", ["big"], "big"),
        ("gen", ["gen"], "gen"),
        ("nope", [], None),
    ],
)
def test_models_for(
    classes_ctx: ClusterContext, cls: str, models: list[str], default: str | None
) -> None:
    assert classes_ctx.models_for(cls) == models
    assert classes_ctx.default_model(cls) == default
    assert classes_ctx.is_request_class(cls) == bool(models)


ARRIVALS = [
    Arrival(origin="cpu", lm="chat", requests=1, prompts=4),
    Arrival(origin="gpu", lm="chat", requests=1, prompts=2),
    Arrival(origin="gpu", lm="img", requests=1, prompts=3),
]
ROUTES: list[dict[str, Any]] = [
    {"origin": "cpu", "lm": "chat", "destination": "cpu", "model": "txt"},
    {"origin": "gpu", "lm": "chat", "destination": "small", "model": "gen"},
    {"origin": "gpu", "lm": "img", "destination": "gpu"},
]


def _route(i: int, **change: Any) -> Callable[[list[dict[str, Any]]], None]:
    def edit(routes: list[dict[str, Any]]) -> None:
        routes[i].update(change)

    return edit


CASES: list[tuple[str, Callable[[list[dict[str, Any]]], None], Expected]] = [
    ("feasible", lambda r: None, []),
    (
        "class-without-model",
        _route(0, model=None),
        [("routes[0]", "request class 'chat' needs a model that serves it, one of: txt, gen")],
    ),
    (
        "model-not-serving-class",
        _route(0, model="big"),
        [("routes[0]", "model 'big' does not serve 'chat'; models that do: txt, gen")],
    ),
    ("unknown-model", _route(0, model="zzz"), [("routes[0]", "unknown model 'zzz'")]),
    (
        "destination-cannot-host-model",
        _route(1, destination="cpu"),
        [("routes[1]", "gen runs on GPU only and cpu has no GPU")],
    ),
    ("lm-route-naming-itself", _route(2, model="img"), []),
    (
        "lm-route-naming-other-lm",
        _route(2, model="gen"),
        [("routes[2]", "model 'gen' does not serve 'img'")],
    ),
    (
        "unknown-class",
        lambda r: r.append({"origin": "cpu", "lm": "zzz", "destination": "cpu"}),
        [("routes[3]", "unknown LM 'zzz'; LMs and request classes: txt, big, img, gen, chat")],
    ),
    (
        "missing-class-pair",
        lambda r: r.__delitem__(1),
        [("routes", "no destination for (gpu, chat)")],
    ),
]


@pytest.mark.parametrize(("edit", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_check_routing_map_with_classes(
    classes_ctx: ClusterContext,
    edit: Callable[[list[dict[str, Any]]], None],
    expected: Expected,
) -> None:
    routes = copy.deepcopy(ROUTES)
    edit(routes)
    got = check_routing_map(RoutingMap.model_validate({"routes": routes}), classes_ctx, ARRIVALS)
    assert_violations(got, expected)


def test_route_model_defaults_to_the_lm_and_is_required_nullable_in_strict_schema() -> None:
    r = Route(origin="a", lm="img", destination="b")
    assert (r.model, r.serving_lm) == (None, "img")
    assert Route(origin="a", lm="chat", destination="b", model="gen").serving_lm == "gen"
    schema = strict_json_schema(RoutingMap)
    route = schema["$defs"]["Route"]
    assert route["required"] == ["origin", "lm", "destination", "model"]
    assert {"type": "null"} in route["properties"]["model"]["anyOf"]
