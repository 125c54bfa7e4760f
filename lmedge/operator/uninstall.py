"""`helm uninstall`'s pre-delete hook: release the LMServices while the operator runs.

Every LMService carries the operator's finalizer (kopf's, for its status
timer), and its model pods are owned by it. Uninstalled with LMServices still
there, the operator is gone before it can release them: the LMServices never
go, the workload namespace hangs in Terminating and the model pods keep
running. The chart's pre-delete hook Job runs this first, while the operator
is still up:

    python -m lmedge.operator.uninstall --namespace lm-serving --timeout 300

It deletes every LMService in the namespace and waits until they and their
model pods are gone. Exit 0 when nothing is left; 1, with one line naming
what is still there (and its finalizers), when the timeout passes or the API
refuses - `helm uninstall` then stops before deleting anything, so the
operator is still there to finish the job on a retry.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence

from lmedge.backends.kubernetes.client import KubeClient
from lmedge.errors import LmedgeError

__all__ = ["left_behind", "main", "release_lmservices"]


def left_behind(client: KubeClient, namespace: str) -> list[str]:
    """What still stands in `namespace`: LMServices (with their finalizers) and model pods."""
    left = []
    for svc in client.list_lmservices(namespace):
        meta = svc.get("metadata") or {}
        finalizers = ", ".join(meta.get("finalizers") or []) or "none"
        left.append(f"LMService {meta.get('name')} (finalizers: {finalizers})")
    left += [f"model pod {p.name}" for p in client.list_model_pods(namespace)]
    return left


def release_lmservices(
    client: KubeClient,
    namespace: str,
    timeout_s: float,
    poll_s: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> list[str]:
    """Delete every LMService in `namespace`; wait for them and their model pods to go.

    Returns what is still there at the deadline (empty: all gone). Deleting
    again on every poll is harmless (a 404 is "already gone") and picks up an
    LMService applied meanwhile.
    """
    deadline = clock() + timeout_s
    while True:
        for svc in client.list_lmservices(namespace):
            client.delete_lmservice(namespace, str(svc["metadata"]["name"]))
        left = left_behind(client, namespace)
        if not left or clock() >= deadline:
            return left
        sleep(poll_s)


def main(argv: Sequence[str] | None = None) -> int:
    """The hook's entry point (module doc); errors are one line on stderr."""
    parser = argparse.ArgumentParser(
        prog="python -m lmedge.operator.uninstall",
        description="Delete a namespace's LMServices; wait until the operator releases them.",
    )
    parser.add_argument("--namespace", required=True, help="the release's workload namespace")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait (300)")
    args = parser.parse_args(argv)
    try:
        client = KubeClient.connect()
        left = release_lmservices(client, args.namespace, args.timeout)
    except LmedgeError as exc:
        print(f"lmedge uninstall hook: {exc}", file=sys.stderr)
        return 1
    if left:
        print(
            f"lmedge uninstall hook: after {args.timeout:g} s still in {args.namespace}: "
            + "; ".join(left)
            + " (is the lmedge controller running?)",
            file=sys.stderr,
        )
        return 1
    print(f"lmedge uninstall hook: no LMService or model pod left in {args.namespace}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
