"""The example scenarios as fixtures, shared by the unit tests (pure logic, no servers).

`ctx` is the paper's testbed (examples/testbed): 6 workers, 4 LMs, the
paper's loop constants. A folder whose tests need another cluster overrides
it (tests/unit/api/conftest.py: a small cluster whose every capacity edge is
known by heart). The fixtures are session-wide and must not be mutated:
derive a changed copy instead (`model_copy(update=...)`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lmedge.api import ClusterContext
from lmedge.sim.scenario import Scenario, load_scenario

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="session")
def testbed() -> Scenario:
    return load_scenario(EXAMPLES / "testbed")


@pytest.fixture(scope="session")
def large() -> Scenario:
    return load_scenario(EXAMPLES / "large")


@pytest.fixture(scope="session")
def ctx(testbed: Scenario) -> ClusterContext:
    return testbed.context()
