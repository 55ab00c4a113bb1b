"""`manage.py demo_fleet`: run one fake agent per node in the database, restarting any that dies.

For the one-command demo: every node gets a fresh token (the previous one stops working), and a
`python -m agent --fake-gpus <count>x<type>` subprocess with short heartbeat and poll intervals, so
the fleet is alive and the demo's jobs (short sleeps) run. The token reaches the agent through
`GPUBANK_AGENT_TOKEN`, never the command line (`ps` shows command lines).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from scheduling.models import Node
from scheduling.services.nodes import issue_node_token

FAKE_MODELS = frozenset({"H100", "A100", "L4", "T4"})  # what `agent --fake-gpus` knows


@dataclass
class Agent:
    """One supervised agent subprocess."""

    node: str
    argv: list[str]
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    next_start: float = 0.0


class Command(BaseCommand):
    help = "Run a fake node agent per node (issues fresh tokens), restarting agents that die."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--server", default="http://127.0.0.1:8000")
        parser.add_argument("--nodes", default="", help="comma-separated node names (default: all)")
        parser.add_argument("--heartbeat-interval", type=float, default=2.0)
        parser.add_argument("--poll-interval", type=float, default=1.0)
        parser.add_argument("--state-dir", default=str(Path(settings.BASE_DIR) / "var" / "agents"))
        parser.add_argument("--once", action="store_true", help="start the agents, wait for them, exit")

    def handle(self, *args: Any, **options: Any) -> None:
        # Every node gets an agent, cordoned ones too: a drained or out-of-service node still
        # reports its health (a machine being drained is still running).
        nodes = Node.objects.select_related("gpu_type").order_by("name")
        if options["nodes"]:
            nodes = nodes.filter(name__in=options["nodes"].split(","))
        agents = [self._agent(node, options) for node in nodes if node.gpu_type.name in FAKE_MODELS]
        if not agents:
            raise CommandError("No nodes with a fake-able GPU type (H100, A100, L4, T4) in the database.")
        stopping = False

        def stop(signum: int, frame: Any) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        try:
            while not stopping:
                now = time.monotonic()
                for agent in agents:
                    self._supervise(agent, now)
                if options["once"] and all(a.proc is not None and a.proc.poll() is not None for a in agents):
                    break
                time.sleep(0.5)
        finally:
            for agent in agents:
                if agent.proc is not None and agent.proc.poll() is None:
                    agent.proc.send_signal(signal.SIGTERM)
            for agent in agents:
                if agent.proc is not None:
                    try:
                        agent.proc.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        agent.proc.kill()

    def _agent(self, node: Node, options: dict[str, Any]) -> Agent:
        token = issue_node_token(node=node)
        state_dir = Path(options["state_dir"]) / node.name
        argv = [
            sys.executable,
            "-m",
            "agent",
            "--server",
            options["server"],
            "--fake-gpus",
            f"{node.gpu_count}x{node.gpu_type.name}",
            "--hostname",
            node.name,
            "--heartbeat-interval",
            str(options["heartbeat_interval"]),
            "--poll-interval",
            str(options["poll_interval"]),
            "--state-dir",
            str(state_dir),
            "--timeout-grace",
            "5",
            "--shutdown-grace",
            "2",
        ]
        if node.nvlink_domain:
            argv += ["--nvlink-domain", node.nvlink_domain]
        if node.ib_group:
            argv += ["--ib-group", node.ib_group]
        return Agent(node.name, argv, {**os.environ, "GPUBANK_AGENT_TOKEN": token})

    def _supervise(self, agent: Agent, now: float) -> None:
        if agent.proc is not None:
            code = agent.proc.poll()
            if code is None:
                return
            if code == 2:  # the server refused the node (bad token / inventory): restarting cannot help
                if agent.restarts >= 0:
                    self.stderr.write(f"agent {agent.node} refused by the server; not restarting")
                    agent.restarts = -1
                return
            agent.restarts += 1
            agent.next_start = now + min(30.0, 2.0 ** min(agent.restarts, 5))
            agent.proc = None
            self.stderr.write(f"agent {agent.node} exited ({code}); restart {agent.restarts}")
        if now >= agent.next_start:
            agent.proc = subprocess.Popen(agent.argv, env=agent.env, cwd=settings.BASE_DIR)
            self.stdout.write(f"agent {agent.node} started (pid {agent.proc.pid})")
