"""The agent's settings, resolved once from the command line (see ``__main__``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DEFAULT_HEARTBEAT_INTERVAL_S = 30.0


@dataclass(frozen=True)
class Config:
    """Everything the agent needs to run; immutable so threads can share it without locks."""

    server: str
    token: str
    hostname: str
    region: str | None = None
    fake_gpus: str | None = None
    nvlink_domain: str | None = None
    ib_group: str | None = None
    state_dir: Path | None = None
    # None means "use the server's heartbeat_interval_s": the server knows its own liveness timeout.
    heartbeat_interval: float | None = None
    poll_interval: float = 5.0
    # Grace between SIGTERM and SIGKILL when the agent itself stops a job (wall time, shutdown).
    timeout_grace: float = 30.0
    shutdown_grace: float = 10.0
    # How long a shutting-down agent keeps trying to deliver exit reports before persisting them.
    shutdown_flush: float = 10.0
    request_timeout: float = 10.0
    backoff_base: float = 1.0
    backoff_cap: float = 60.0

    def __post_init__(self) -> None:
        if not self.server.startswith(("http://", "https://")):
            raise ValueError(f"--server must be an http(s) URL, got {self.server!r}")
        if not self.token:
            raise ValueError("a node token is required (--token or GPUBANK_AGENT_TOKEN)")
        for name in ("poll_interval", "request_timeout", "backoff_base", "backoff_cap"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")
        if self.heartbeat_interval is not None and self.heartbeat_interval <= 0:
            raise ValueError("heartbeat_interval must be > 0")
        for name in ("timeout_grace", "shutdown_grace", "shutdown_flush"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")

    @property
    def outbox_path(self) -> Path | None:
        return None if self.state_dir is None else self.state_dir / "outbox.json"

    @property
    def job_log_dir(self) -> Path | None:
        return None if self.state_dir is None else self.state_dir / "jobs"
