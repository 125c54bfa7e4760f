"""The lmedge exception tree.

    LmedgeError                      base of everything lmedge raises on purpose
    ├── UserError                    a person's mistake: bad file, flag, manifest or URI
    │   ├── ManifestError            a CR manifest or scenario file that does not validate
    │   ├── ConfigError              a setting, flag or policy name that is not valid
    │   ├── InfeasibleScenarioError  a scenario no placement can serve (an LM fits nowhere)
    │   └── StoreError               a store URI that is malformed, or an empty store
    └── TransientError               worth retrying: the same call may succeed later
        ├── StoreUnavailable         the document store did not answer in time
        ├── LLMUnavailable           the LLM endpoint timed out, throttled (429) or failed (5xx)
        └── ClusterUnavailable       the Kubernetes API server did not answer / conflicted

`retryable` is a property of the class, so the operator (TemporaryError vs
PermanentError), the agents (fallback vs retry) and the emulator classify a
failure the same way. Library errors are wrapped at the boundary with
`raise ... from exc` so the cause stays visible in logs while the CLI prints
one line.
"""

from __future__ import annotations


class LmedgeError(Exception):
    """Base class of every error lmedge raises deliberately."""

    retryable: bool = False


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


class TransientError(LmedgeError):
    """A failure that may go away by itself; callers retry or fall back."""

    retryable = True


class StoreUnavailable(TransientError):
    """The document store did not answer within its timeout."""


class LLMUnavailable(TransientError):
    """The LLM endpoint timed out, throttled or failed."""


class ClusterUnavailable(TransientError):
    """The Kubernetes API server did not answer or reported a conflict."""
