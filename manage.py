#!/usr/bin/env python
"""Django's command-line utility."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    from django.core.management import execute_from_command_line

    from config.telemetry import setup_telemetry

    setup_telemetry(role=f"manage:{sys.argv[1] if len(sys.argv) > 1 else ''}")  # off unless OTEL_* set

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
