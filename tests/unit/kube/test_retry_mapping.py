"""The operator's retry mapping follows `retryable` on the error classes (`lmedge.errors`)."""

from __future__ import annotations

import kopf
import pytest

from lmedge.errors import (
    ClusterRefused,
    ClusterUnavailable,
    ConfigError,
    LmedgeError,
    ManifestError,
    NotFound,
    StoreUnavailable,
    TransientError,
)
from lmedge.operator.handlers import classified

CASES: list[tuple[str, LmedgeError, type[Exception], float | None]] = [
    ("bad-spec", ManifestError("x", "memory", "too small"), kopf.PermanentError, None),
    ("rbac-said-no", ClusterRefused("label Node w1", 403, "forbidden"), kopf.PermanentError, None),
    ("bad-setting", ConfigError("no such profile"), kopf.PermanentError, None),
    ("api-down", ClusterUnavailable("list Nodes: HTTP 503"), kopf.TemporaryError, 10.0),
    ("store-down", StoreUnavailable("no answer"), kopf.TemporaryError, 10.0),
    ("node-not-there-yet", NotFound("read Node w1: not found"), kopf.TemporaryError, 30.0),
]  # fmt: skip


@pytest.mark.parametrize(
    ("error", "kind", "delay"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_retryable_errors_are_temporary_with_their_class_delay(
    error: LmedgeError, kind: type[Exception], delay: float | None
) -> None:
    with pytest.raises(kind) as raised, classified():
        raise error
    assert raised.value.__cause__ is error and str(error) in str(raised.value)
    if delay is not None:
        assert isinstance(raised.value, kopf.TemporaryError) and raised.value.delay == delay


def test_a_new_retryable_class_is_retried_without_touching_the_mapping() -> None:
    class GpuBusy(TransientError):
        retry_delay_s = 3.0

    with pytest.raises(kopf.TemporaryError) as raised, classified():
        raise GpuBusy("device plugin busy")
    assert raised.value.delay == 3.0
