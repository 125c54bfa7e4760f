"""Scenario fixtures for the agent unit tests (pure logic, no servers)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmedge.api import ClusterContext
from lmedge.sim.scenario import Scenario, load_scenario

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


@pytest.fixture(scope="session")
def testbed() -> Scenario:
    return load_scenario(EXAMPLES / "testbed")


@pytest.fixture(scope="session")
def large() -> Scenario:
    return load_scenario(EXAMPLES / "large")


@pytest.fixture(scope="session")
def ctx(testbed: Scenario) -> ClusterContext:
    return testbed.context()
