"""``python -m agent --server URL --token T [--fake-gpus 8xH100] ...``: argument parsing and signals."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
from pathlib import Path
from types import FrameType

from agent import __version__
from agent.config import Config
from agent.gpus import GpuError, discover
from agent.logs import setup_logging
from agent.loop import Agent

log = logging.getLogger("agent")


def _positive(value: str) -> float:
    number = float(value)
    if number <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return number


def _non_negative(value: str) -> float:
    number = float(value)
    if number < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return number


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m agent", description="GPU Bank node agent (docs/agent.md).")
    p.add_argument("--server", required=True, help="service base URL, e.g. http://127.0.0.1:8000")
    p.add_argument(
        "--token",
        default=os.environ.get("GPUBANK_AGENT_TOKEN"),
        help="node token from the admin (default: $GPUBANK_AGENT_TOKEN, which keeps it out of `ps`)",
    )
    p.add_argument("--fake-gpus", help="fake inventory like 8xH100 or 4xA100 (models: H100, A100, L4, T4)")
    p.add_argument(
        "--heartbeat-interval",
        type=_positive,
        default=None,
        help="seconds between heartbeats (default: the server's heartbeat_interval_s, else 30)",
    )
    p.add_argument(
        "--poll-interval", type=_positive, default=5.0, help="seconds between assignment polls (5)"
    )
    p.add_argument("--region")
    p.add_argument("--hostname", default=socket.gethostname())
    p.add_argument("--nvlink-domain")
    p.add_argument("--ib-group")
    p.add_argument("--state-dir", type=Path, help="where undelivered exit reports and job logs are kept")
    p.add_argument(
        "--timeout-grace",
        type=_non_negative,
        default=30.0,
        help="SIGTERM->SIGKILL grace at max wall time (30)",
    )
    p.add_argument(
        "--shutdown-grace",
        type=_non_negative,
        default=10.0,
        help="SIGTERM->SIGKILL grace on agent shutdown (10)",
    )
    p.add_argument(
        "--shutdown-flush",
        type=_non_negative,
        default=10.0,
        help="seconds to deliver exit reports on shutdown (10)",
    )
    p.add_argument("--request-timeout", type=_positive, default=10.0, help="per-request HTTP timeout (10)")
    p.add_argument("--backoff-base", type=_positive, default=1.0, help="first retry delay in seconds (1)")
    p.add_argument("--backoff-cap", type=_positive, default=60.0, help="longest retry delay in seconds (60)")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    p.add_argument("--version", action="version", version=f"gpubank-agent {__version__}")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(getattr(logging, args.log_level))
    try:
        config = Config(
            server=args.server,
            token=args.token or "",
            hostname=args.hostname,
            region=args.region,
            fake_gpus=args.fake_gpus,
            nvlink_domain=args.nvlink_domain,
            ib_group=args.ib_group,
            state_dir=args.state_dir,
            heartbeat_interval=args.heartbeat_interval,
            poll_interval=args.poll_interval,
            timeout_grace=args.timeout_grace,
            shutdown_grace=args.shutdown_grace,
            shutdown_flush=args.shutdown_flush,
            request_timeout=args.request_timeout,
            backoff_base=args.backoff_base,
            backoff_cap=args.backoff_cap,
        )
        gpus, sampler = discover(config.fake_gpus, config.hostname)
    except (ValueError, GpuError) as exc:
        log.error("%s", exc)
        return 2

    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        # Only set a flag: the loop notices within one tick and shuts down outside the handler.
        log.info("received %s; shutting down", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    return Agent(config, gpus, sampler).run(stop)


if __name__ == "__main__":
    sys.exit(main())
