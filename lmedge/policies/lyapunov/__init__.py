"""The Lyapunov drift-plus-penalty deployer (`lyapunov`) and its calibration."""

from lmedge.policies.lyapunov.deployer import (
    NAME,
    LyapunovDeployer,
    LyapunovParams,
    build,
    contention,
    default_alphas,
)

__all__ = ["NAME", "LyapunovDeployer", "LyapunovParams", "build", "contention", "default_alphas"]
