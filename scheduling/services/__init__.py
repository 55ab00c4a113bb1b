"""Scheduling services: every write of the scheduling app."""
