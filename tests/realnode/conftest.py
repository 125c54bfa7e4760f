"""Fixtures of the real-node tier (tests/realnode/tier.py).

``realnode_tier`` is one tier for the session: the local control plane, CoreDNS
and two real workers (kubelet + containerd each). Every test using it carries
the ``realnode`` marker. A machine that cannot run it (not root, no
containerd, images or kubelet not built) skips with the reason, except under
``LMEDGE_REQUIRE_TOOLS=1`` (CI), where that is a failure. With
``LMEDGE_REALNODE_DIR=DIR`` the tests use the tier ``tools/realnode/up.sh DIR``
left running instead (and leave it running).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.realnode.tier import RealNodeTier, unmet_requirements


def _required() -> bool:
    return os.environ.get("LMEDGE_REQUIRE_TOOLS", "") not in ("", "0", "false")


@pytest.fixture(scope="session")
def realnode_tier(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealNodeTier]:
    """The running tier; torn down (processes, namespaces, cgroups, sysctls) at the end."""
    attached = os.environ.get("LMEDGE_REALNODE_DIR")
    if attached:
        # A tier tools/realnode/up.sh left running: use it, leave it running.
        yield RealNodeTier.attach(Path(attached))
        return
    problems = unmet_requirements()
    if problems:
        reason = "real-node tier cannot run here: " + "; ".join(problems)
        if _required():
            pytest.fail(reason)
        pytest.skip(reason)
    tier = RealNodeTier(tmp_path_factory.mktemp("realnode"))
    tier.up()
    try:
        yield tier
    finally:
        tier.down()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "realnode: needs root, containerd, `make images` and the kubelet (two real workers)",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "realnode_tier" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.realnode)
