"""The lmedge exception tree: every error lmedge raises on purpose is one of these.

    LmedgeError                      base; `retryable` and `retry_delay_s` classify it
    ├── UserError                    a person's mistake: bad file, flag, manifest or URI (exit 2)
    │   ├── ManifestError            a CR manifest or scenario file that does not validate
    │   ├── ConfigError              a setting, flag or policy name that is not valid
    │   ├── InfeasibleScenarioError  a scenario no placement can serve (an LM fits nowhere)
    │   ├── StoreError               a store URI that is malformed, or an empty store
    │   ├── UnknownLM                a request or map names no LM or request class here (404)
    │   ├── DuplicateRequestId       a client-chosen request id used twice at a gateway (409)
    │   └── BadRequest               an OpenAI-style request the gateway cannot serve (400)
    ├── ClusterRefused               the API server said no: RBAC, admission, invalid object
    ├── ModelFailed                  a model pod rejected a prompt set or failed on it
    ├── NotFound                     a Kubernetes object does not exist (HTTP 404) [retryable]
    └── TransientError               worth retrying: the same call may succeed later [retryable]
        ├── StoreUnavailable         the document store did not answer in time
        ├── LLMUnavailable           the LLM endpoint timed out, throttled (429) or failed (5xx)
        ├── ClusterUnavailable       the Kubernetes API server did not answer / conflicted
        ├── PeerUnavailable          another node's gateway did not answer or refused a set
        ├── ModelUnavailable         a model pod does not answer or is not ready yet
        └── Rejected                 admission control refused a set; retry after its slot

`retryable` is a property of the class, so the operator (`kopf.TemporaryError`
with `retry_delay_s` vs `kopf.PermanentError`, `lmedge.operator.handlers`),
the agents (fallback vs retry) and the emulator classify a failure the same
way. Library errors are wrapped at their boundary (`kubernetes` in
`lmedge.backends.kubernetes.client`, `pymongo` in `lmedge.store.backends`,
`httpx` in the HTTP clients) with `raise ... from exc`, so the cause stays
visible in logs while the CLI prints one line.

Deliberately outside the tree: `lmedge.dataplane.auth.Denied` is an HTTP answer
(a starlette `HTTPException`, which the framework turns into 401/403/503), and
`lmedge.dashboard.views.NotFound` a `LookupError` the dashboard renders as a
404 page; private exceptions (a leading underscore) carry control flow inside
one module and never leave it.
"""

from __future__ import annotations

__all__ = [
    "BadRequest",
    "ClusterRefused",
    "ClusterUnavailable",
    "ConfigError",
    "DuplicateRequestId",
    "InfeasibleScenarioError",
    "LLMUnavailable",
    "LmedgeError",
    "ManifestError",
    "ModelFailed",
    "ModelUnavailable",
    "NotFound",
    "PeerUnavailable",
    "Rejected",
    "StoreError",
    "StoreUnavailable",
    "TransientError",
    "UnknownLM",
    "UserError",
]


class LmedgeError(Exception):
    """Base class of every error lmedge raises deliberately.

    `retryable`: whether the same action may succeed later without anyone
    changing anything; `retry_delay_s`: how long a retrying caller (the
    operator) waits before the next attempt, seconds.
    """

    retryable: bool = False
    retry_delay_s: float = 0.0


class UserError(LmedgeError):
    """A mistake in user input. The CLI prints `str(err)` and exits with code 2."""

    exit_code: int = 2


class ManifestError(UserError):
    """A manifest or scenario file that does not validate; names the file and field."""

    def __init__(self, source: str, field: str, message: str) -> None:
        self.source = source
        self.field = field
        self.message = message
        where = f"{source}: {field}" if field else source
        super().__init__(f"{where}: {message}")


class ConfigError(UserError):
    """An invalid setting, CLI flag or plugin/profile name."""


class InfeasibleScenarioError(UserError):
    """A scenario that cannot be served at all, e.g. an LM that fits on no node."""


class StoreError(UserError):
    """A store URI that is malformed or points at nothing usable."""


class UnknownLM(UserError):
    """A request (or a routing map) named an LM or request class this cluster does not have."""


class DuplicateRequestId(UserError):
    """A client-chosen request id was already used at this gateway (HTTP 409).

    Answering it again would give two users one record (and a model server
    one progress file for two prompt sets), so the second use is refused.
    """


class BadRequest(UserError):
    """A request the gateway cannot serve as asked (HTTP 400)."""


class ClusterRefused(LmedgeError):
    """The API server refused the request (RBAC, admission or validation).

    Retrying cannot help: the message is the API server's, for a person.
    """

    def __init__(self, action: str, status: int, message: str) -> None:
        self.status = status
        self.message = message
        super().__init__(f"{action}: HTTP {status}: {message}")


class ModelFailed(LmedgeError):
    """The model pod rejected the set or failed on it; not retried."""


class NotFound(LmedgeError):
    """A Kubernetes object the action needs does not exist (HTTP 404).

    Retryable, after a while: the object may yet be created (a Node that has
    not joined, an EdgeNode applied before its Node). The client itself never
    retries a 404; the operator retries its handler after `retry_delay_s`.
    """

    retryable = True
    retry_delay_s = 30.0


class TransientError(LmedgeError):
    """A failure that may go away by itself; callers retry or fall back."""

    retryable = True
    retry_delay_s = 10.0


class StoreUnavailable(TransientError):
    """The document store did not answer within its timeout."""


class LLMUnavailable(TransientError):
    """The LLM endpoint timed out, throttled or failed."""


class ClusterUnavailable(TransientError):
    """The Kubernetes API server did not answer or reported a conflict."""


class PeerUnavailable(TransientError):
    """The destination node's gateway did not answer or refused the set."""


class ModelUnavailable(TransientError):
    """The model pod did not answer or is not ready yet; retried until the deadline."""


class Rejected(TransientError):
    """Admission control refused a set at once; retry after `retry_after_s` seconds.

    Retryable: the next slot's map may admit it. The set is already recorded
    (outcome `rejected`) when this is raised.
    """

    def __init__(self, message: str, *, request_id: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.request_id = request_id
        self.retry_after_s = retry_after_s
