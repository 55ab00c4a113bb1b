"""The DB side of the scheduler: load a core Snapshot, write the core's decisions in one transaction."""
