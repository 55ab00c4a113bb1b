"""Core pass time on real deep queues: snapshots captured from the Philly replay, then timed.

    python bench/scheduler_scale_replay.py --capture deep.pkl [--min-pending 2300] [--every 100]
    python bench/scheduler_scale_replay.py --snapshots deep.pkl [--repeat 3]

`--capture` runs the Philly replay (full trace, default fleet, policy `ours`) and pickles the first
40 pass inputs (`Snapshot`s) taken every `--every` passes once at least `--min-pending` jobs wait;
it stops as soon as it has them. `--snapshots` times `schedule()` on each (CPU, best of
`--repeat`) next to a baseline measured in the same run (sorting the pending jobs by submission),
and prints a digest of each Result: run it from two checkouts on the same file to compare pass
times, and the digests to check that the decisions are identical.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import pickle
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench.scheduler_scale_core import best_cpu_seconds, fifo_order
from scheduling.core import Result, Snapshot, schedule

WANTED = 40


def digest(result: Result) -> str:
    """Decisions, reservations and wait reasons, as one short hash."""
    text = repr((result.decisions, result.reservations, sorted(result.wait_reasons.items())))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def capture(path: Path, min_pending: int, every: int) -> None:
    # The replay (and its trace loading) is only needed to capture.
    import replay
    from _traces import load_philly

    taken: list[Snapshot] = []
    passes = 0

    class Enough(Exception):
        pass

    def hooked(snap: Snapshot) -> Result:
        nonlocal passes
        passes += 1
        if passes % every == 0 and len(snap.pending) >= min_pending:
            taken.append(snap)
            if len(taken) == WANTED:
                raise Enough
        return schedule(snap)

    replay.schedule = hooked  # type: ignore[attr-defined]
    sim = replay.Sim(load_philly(), dict(replay.POLICIES)["ours"], "ours")
    with contextlib.suppress(Enough):
        sim.run(progress=True)
    path.write_bytes(pickle.dumps(taken))
    print(f"captured {len(taken)} snapshots after {passes} passes -> {path}")


def measure(path: Path, repeat: int) -> None:
    snaps: list[Snapshot] = pickle.loads(path.read_bytes())  # noqa: S301 - a file this bench wrote
    total = base_total = 0.0
    for s in snaps:
        core = best_cpu_seconds(lambda s=s: schedule(s), repeat)
        base = best_cpu_seconds(lambda s=s: fifo_order(s), repeat)
        total += core
        base_total += base
        print(
            f"pending={len(s.pending):5d} running={len(s.running):4d} core {core * 1000:6.1f} ms "
            f"baseline sort {base * 1000:5.2f} ms digest {digest(schedule(s))}"
        )
    n = len(snaps)
    print(
        f"mean core pass {total / n * 1000:.1f} ms CPU over {n} snapshots (best of {repeat}), "
        f"baseline sort {base_total / n * 1000:.2f} ms, ratio {total / base_total:.0f}x"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--capture", type=Path, default=None)
    ap.add_argument("--snapshots", type=Path, default=None)
    ap.add_argument("--min-pending", type=int, default=2300)
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    if args.capture:
        capture(args.capture, args.min_pending, args.every)
    if args.snapshots:
        measure(args.snapshots, args.repeat)
    if not (args.capture or args.snapshots):
        ap.error("give --capture FILE and/or --snapshots FILE")


if __name__ == "__main__":
    main()
