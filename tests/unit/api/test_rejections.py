"""Admission control in the routing map: how a router says "refuse this pair"."""

from __future__ import annotations

import json

import jsonschema_rs
import pytest

from lmedge.api import (
    Arrival,
    ClusterContext,
    Rejection,
    Route,
    RoutingMap,
    check_routing_map,
)
from lmedge.api.schema import strict_json_schema

ARRIVALS = [
    Arrival(origin="cpu", lm="txt", requests=1, prompts=4),
    Arrival(origin="gpu", lm="gen", requests=1, prompts=2),
]


def _messages(routing: RoutingMap, ctx: ClusterContext, **kw: bool) -> list[str]:
    return [str(v) for v in check_routing_map(routing, ctx, ARRIVALS, **kw)]


def test_a_rejected_pair_needs_no_route(ctx: ClusterContext) -> None:
    routing = RoutingMap(
        routes=[Route(origin="cpu", lm="txt", destination="cpu")],
        rejections=[Rejection(origin="gpu", lm="gen")],
    )
    assert _messages(routing, ctx) == []
    assert routing.rejected() == {("gpu", "gen")}


def test_a_pair_neither_routed_nor_rejected_is_still_missing(ctx: ClusterContext) -> None:
    routing = RoutingMap(routes=[], rejections=[Rejection(origin="gpu", lm="gen")])
    assert _messages(routing, ctx) == ["routes: no destination for (cpu, txt)"]


@pytest.mark.parametrize(
    ("rejections", "expected"),
    [
        (
            [Rejection(origin="cpu", lm="txt"), Rejection(origin="gpu", lm="gen")],
            "routes[0]: (cpu, txt) is both routed and rejected",
        ),
        (
            [Rejection(origin="gpu", lm="gen"), Rejection(origin="gpu", lm="gen")],
            "rejections[1]: (gpu, gen) is rejected twice",
        ),
        (
            [Rejection(origin="gpu", lm="gen"), Rejection(origin="nowhere", lm="gen")],
            "rejections[1]: unknown origin node 'nowhere'",
        ),
        (
            [Rejection(origin="gpu", lm="gen"), Rejection(origin="gpu", lm="nope")],
            "rejections[1]: unknown LM 'nope'; LMs and request classes: txt, big, img, gen",
        ),
    ],
    ids=["routed-and-rejected", "twice", "unknown-origin", "unknown-lm"],
)
def test_bad_rejections_are_violations(
    ctx: ClusterContext, rejections: list[Rejection], expected: str
) -> None:
    routing = RoutingMap(
        routes=[Route(origin="cpu", lm="txt", destination="cpu")], rejections=rejections
    )
    assert _messages(routing, ctx) == [expected]


def test_no_rejection_allowed_when_admission_is_off(ctx: ClusterContext) -> None:
    routing = RoutingMap(
        routes=[Route(origin="cpu", lm="txt", destination="cpu")],
        rejections=[Rejection(origin="gpu", lm="gen")],
    )
    assert _messages(routing, ctx, allow_rejections=False) == [
        "rejections[0]: admission control is off: route (gpu, gen), do not reject it"
    ]


def test_strict_schema_expresses_rejections() -> None:
    """What the LLM answers in: the list is required (may be empty), items closed."""
    schema = strict_json_schema(RoutingMap)
    assert set(schema["required"]) == {"routes", "rejections"}
    item = schema["$defs"]["Rejection"]
    assert item["additionalProperties"] is False
    assert set(item["required"]) == {"origin", "lm"}
    validator = jsonschema_rs.Draft202012Validator(schema)
    reply = {"routes": [], "rejections": [{"origin": "gpu", "lm": "gen"}]}
    assert validator.is_valid(reply)
    assert not validator.is_valid({"routes": []}), "strict: rejections must be present"
    assert RoutingMap.model_validate_json(json.dumps(reply)).rejected() == {("gpu", "gen")}
