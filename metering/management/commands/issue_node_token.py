"""`manage.py issue_node_token <node>`: print a fresh bearer token for a node's agent (rotates it)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from scheduling.models import Node
from scheduling.services.nodes import issue_node_token


class Command(BaseCommand):
    help = "Issue (rotate) a node's agent token and print it once."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("node", help="node name")

    def handle(self, *args: Any, **options: Any) -> None:
        node = Node.objects.filter(name=options["node"]).first()
        if node is None:
            raise CommandError(f"No node named {options['node']!r}.")
        self.stdout.write(issue_node_token(node=node))
