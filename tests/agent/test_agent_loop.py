"""The agent's loop against a fake server: registration, jobs, heartbeats, stops, outages."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from agent import __version__

P = "/api/v1/agent"
TOKEN = "node-token-123"


def test_registers_its_gpus_and_labels_then_heartbeats_with_no_attempts(
    fake_server, run_agent, wait_for
) -> None:
    run_agent()
    wait_for(lambda: len(fake_server.heartbeats()) >= 2, what="liveness heartbeats")

    (register,) = fake_server.seen("POST", f"{P}/register")
    body = register.body
    assert body["hostname"] == "node-a"
    assert body["region"] == "eu-1"
    assert body["labels"] == {"nvlink_domain": "nvl-1", "ib_group": "ib-2"}
    assert body["agent_version"] == __version__
    assert [(g["index"], g["model"], g["memory_gb"]) for g in body["gpus"]] == [
        (i, "H100", 80) for i in range(4)
    ]
    assert all(g["uuid"].startswith("GPU-") for g in body["gpus"])
    assert len({g["uuid"] for g in body["gpus"]}) == 4
    assert fake_server.heartbeats()[0].body == {"attempts": []}
    with fake_server.lock:
        assert {r.auth for r in fake_server.requests} == {f"Bearer {TOKEN}"}


def test_registration_retries_until_the_server_is_up(fake_server, run_agent, wait_for) -> None:
    fake_server.fail_status = 503
    running = run_agent()
    wait_for(lambda: len(fake_server.seen("POST", f"{P}/register", 503)) >= 3, what="register retries")
    fake_server.fail_status = None
    wait_for(lambda: running.agent.node_id == 7, what="registration")
    assert len(fake_server.seen("POST", f"{P}/register", 200)) == 1


def test_registration_refused_is_fatal(fake_server, run_agent, wait_for) -> None:
    fake_server.fail_status = 401
    running = run_agent()
    running.thread.join(5)
    assert running.result == [2]
    assert len(fake_server.seen("POST", f"{P}/register")) == 1


def test_job_gets_its_gpus_env_and_is_started_once(
    fake_server, run_agent, wait_for, job_dir, monkeypatch
) -> None:
    monkeypatch.setenv("GPUBANK_AGENT_TOKEN", "secret")
    fake_server.repeat_starts = True  # the server keeps saying "start": the agent must not re-spawn
    fake_server.add_start(
        11,
        f"echo run >> {job_dir}/runs; env > {job_dir}/env; sleep 0.3",
        gpus=[2, 3],
        env={"WANDB_MODE": "offline"},
    )
    run_agent()
    wait_for(lambda: fake_server.exits(11), what="exit report")

    env = dict(line.split("=", 1) for line in (job_dir / "env").read_text().splitlines() if "=" in line)
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert env["WANDB_MODE"] == "offline"
    assert env["GPUBANK_ATTEMPT_ID"] == "11"
    assert "GPUBANK_AGENT_TOKEN" not in env  # the node token never leaks into a job
    assert (job_dir / "runs").read_text() == "run\n"
    assert len(fake_server.seen("POST", f"{P}/attempts/11/started")) == 1
    assert fake_server.seen("POST", f"{P}/attempts/11/started")[0].body == {}


def test_heartbeats_carry_increasing_seq_and_cumulative_usage(fake_server, run_agent, wait_for) -> None:
    fake_server.add_start(21, "sleep 0.6", gpus=[0, 1])
    t0 = time.monotonic()
    run_agent()
    (exit_report,) = wait_for(lambda: fake_server.exits(21), what="exit report")
    elapsed_ms = (time.monotonic() - t0) * 1000

    # While it runs (with telemetry; once ended, its line names its exit report until delivered).
    lines = [a for r in fake_server.heartbeats() for a in r.body["attempts"]
             if a["attempt_id"] == 21 and "gpu_utilization" in a]
    assert len(lines) >= 3
    seqs = [a["seq"] for a in lines]
    usage = [a["cumulative_gpu_ms"] for a in lines]
    assert seqs == list(range(1, len(seqs) + 1))
    assert usage == sorted(usage)
    assert all(0 <= a["gpu_utilization"] <= 100 and a["memory_used_mb"] >= 0 for a in lines)
    final = exit_report.body
    assert final["seq"] > seqs[-1]
    assert usage[-1] <= final["cumulative_gpu_ms"] <= 2 * elapsed_ms
    # Two GPUs for ~0.6 s of the agent's monotonic clock.
    assert final["cumulative_gpu_ms"] >= 2 * 550
    assert final == {**final, "exit_code": 0, "signal": None, "outcome": "completed"}


@pytest.mark.parametrize(
    ("command", "exit_code", "outcome"), [("exit 0", 0, "completed"), ("exit 3", 3, "failed")]
)
def test_exit_code_is_reported(fake_server, run_agent, wait_for, command, exit_code, outcome) -> None:
    fake_server.add_start(31, command)
    run_agent()
    (report,) = wait_for(lambda: fake_server.exits(31), what="exit report")
    assert report.body["exit_code"] == exit_code
    assert report.body["signal"] is None
    assert report.body["outcome"] == outcome
    # /started always reaches the server before /exit.
    assert fake_server.seen("POST", f"{P}/attempts/31/started")[0].at <= report.at


def test_stop_sends_sigterm_then_sigkill_after_grace(fake_server, run_agent, wait_for, job_dir) -> None:
    # The job traps TERM (like a trainer writing a checkpoint) and would run forever.
    fake_server.add_start(
        41, f"trap 'echo term > {job_dir}/term' TERM; touch {job_dir}/ready; while :; do sleep 0.05; done"
    )
    run_agent()
    wait_for(lambda: (job_dir / "ready").exists(), what="job ready")
    fake_server.add_stop(41, "preempted", grace=0.5)
    (report,) = wait_for(lambda: fake_server.exits(41), what="exit report")

    term_at = (job_dir / "term").stat().st_mtime  # the trap ran: SIGTERM came first
    assert report.wall - term_at >= 0.45  # SIGKILL only after the grace
    assert report.body["outcome"] == "preempted"
    assert report.body["signal"] == signal.SIGKILL
    assert report.body["exit_code"] is None


def test_max_wall_time_is_enforced_as_timed_out(fake_server, run_agent, wait_for) -> None:
    fake_server.add_start(51, "sleep 30", max_wall=1)
    t0 = time.monotonic()
    run_agent(timeout_grace=0.3)
    (report,) = wait_for(lambda: fake_server.exits(51), what="exit report")
    assert 1.0 <= report.at - t0 < 5.0
    assert report.body["outcome"] == "timed_out"
    assert report.body["signal"] in (signal.SIGTERM, signal.SIGKILL)


def test_the_servers_time_out_grace_wins_over_the_agents(fake_server, run_agent, wait_for) -> None:
    """The server bills a timed-out run up to its max wall time plus the grace it sends in the start
    (review: the agent's own --timeout-grace, 30 s, ran past what the hold could be extended to)."""
    fake_server.add_start(52, "trap '' TERM; while :; do sleep 0.05; done", max_wall=1, timeout_grace=0.3)
    t0 = time.monotonic()
    run_agent(timeout_grace=30)
    (report,) = wait_for(lambda: fake_server.exits(52), what="exit report")
    assert 1.3 <= report.at - t0 < 5.0  # killed 0.3 s after the wall time, not 30 s
    assert report.body["outcome"] == "timed_out"
    assert report.body["signal"] == signal.SIGKILL


def test_503_outage_then_recovery_delivers_the_exit_exactly_once(fake_server, run_agent, wait_for) -> None:
    fake_server.add_start(61, "sleep 0.3; exit 4")
    run_agent()
    wait_for(lambda: fake_server.started == {61}, what="started")
    fake_server.fail_status = 503
    wait_for(lambda: len(fake_server.exits(61, status=503)) >= 2, what="exit retried during outage")
    fake_server.fail_status = None
    wait_for(lambda: fake_server.exits(61), what="exit delivered")
    beats = len(fake_server.heartbeats())
    wait_for(lambda: len(fake_server.heartbeats()) >= beats + 5, what="heartbeats after recovery")

    (report,) = fake_server.exits(61)
    assert report.body["outcome"] == "failed" and report.body["exit_code"] == 4
    assert len(fake_server.seen("POST", f"{P}/attempts/61/exit")) == len(fake_server.exits(61, 503)) + 1


def test_server_down_then_back_delivers_the_exit_exactly_once(fake_server, run_agent, wait_for) -> None:
    fake_server.add_start(62, "sleep 0.3")
    running = run_agent()
    wait_for(lambda: fake_server.started == {62}, what="started")
    fake_server.pause()  # connection refused from now on
    wait_for(lambda: 62 in running.agent.outbox, what="exit queued during outage")
    time.sleep(0.3)  # a few backoff rounds against a closed port
    fake_server.serve()  # same port
    wait_for(lambda: fake_server.exits(62), what="exit delivered")
    beats = len(fake_server.heartbeats())
    wait_for(lambda: len(fake_server.heartbeats()) >= beats + 5, what="heartbeats after recovery")
    assert len(fake_server.seen("POST", f"{P}/attempts/62/exit")) == 1
    assert fake_server.exits(62)[0].body["outcome"] == "completed"
    assert len(running.agent.outbox) == 0


def test_retry_after_is_honoured(fake_server, run_agent, wait_for) -> None:
    fake_server.add_start(63, "true")
    fake_server.exit_status[63] = 429
    fake_server.retry_after = "1"
    run_agent()
    wait_for(lambda: fake_server.exits(63, status=429), what="first exit try")
    first = fake_server.exits(63, status=429)[0].at
    fake_server.exit_status.pop(63)
    (report,) = wait_for(lambda: fake_server.exits(63), what="exit delivered")
    assert report.at - first >= 0.95  # backoff_cap is 0.2 s, so only Retry-After explains the wait


@pytest.mark.parametrize("status", [409, 400])
def test_conflict_or_client_error_on_exit_is_dropped_not_retried(
    fake_server, run_agent, wait_for, status
) -> None:
    fake_server.add_start(71, "true")
    fake_server.exit_status[71] = status
    running = run_agent()
    wait_for(lambda: fake_server.exits(71, status=status), what="exit refused")
    beats = len(fake_server.heartbeats())
    wait_for(lambda: len(fake_server.heartbeats()) >= beats + 5, what="more loop iterations")
    assert len(fake_server.seen("POST", f"{P}/attempts/71/exit")) == 1
    assert 71 not in running.agent.outbox


def test_restarted_agent_delivers_the_persisted_outbox(fake_server, run_agent, wait_for, tmp_path) -> None:
    state = tmp_path / "state"
    # The run exits only once the server fails (a file says so): with a fixed sleep, a loaded
    # machine delivered the exit report before the test set the failure, and no outbox was kept.
    go = tmp_path / "go"
    fake_server.add_start(81, f"echo run >> {tmp_path}/runs; until [ -e {go} ]; do sleep 0.05; done; exit 7")
    first = run_agent(state_dir=state, shutdown_flush=0.2)
    wait_for(lambda: fake_server.started == {81}, what="started")
    fake_server.fail_status = 503
    go.touch()
    outbox_file = state / "outbox.json"
    wait_for(lambda: outbox_file.exists() and "81" in outbox_file.read_text(), what="outbox persisted")
    assert first.stop() == 0
    saved = json.loads(outbox_file.read_text())
    assert saved["reports"][0]["attempt_id"] == 81
    assert saved["reports"][0]["body"]["exit_code"] == 7

    # The server still believes 81 runs on this node: the restarted agent must deliver the real
    # report from its outbox, not a "lost" one.
    # It also still lists 81 in `start` (say its /started was lost): it must not run again.
    fake_server.fail_status = None
    fake_server.running_attempts = [81]
    fake_server.repeat_starts = True
    run_agent(state_dir=state)
    (report,) = wait_for(lambda: fake_server.exits(81), what="exit delivered after restart")
    assert report.body["outcome"] == "failed" and report.body["exit_code"] == 7
    polls = len(fake_server.seen("GET", f"{P}/assignments"))
    wait_for(lambda: len(fake_server.seen("GET", f"{P}/assignments")) >= polls + 5, what="more polls")
    assert (tmp_path / "runs").read_text() == "run\n"
    wait_for(lambda: json.loads(outbox_file.read_text())["reports"] == [], what="outbox emptied")
    assert (state / "jobs" / "attempt-81.log").exists()


def test_restarted_agent_reports_attempts_it_no_longer_runs_as_lost(fake_server, run_agent, wait_for) -> None:
    fake_server.running_attempts = [91]
    run_agent()
    (report,) = wait_for(lambda: fake_server.exits(91), what="lost report")
    assert report.body == {
        "seq": 0,
        "cumulative_gpu_ms": 0,
        "exit_code": None,
        "signal": None,
        "outcome": "lost",
    }


def test_stop_for_an_attempt_that_never_ran_here_is_reported(
    fake_server, run_agent, wait_for, job_dir
) -> None:
    fake_server.add_start(92, f"touch {job_dir}/ran")
    fake_server.add_stop(92, "cancelled", grace=5)  # cancelled before the agent picked it up
    run_agent()
    (report,) = wait_for(lambda: fake_server.exits(92), what="exit report")
    assert report.body["outcome"] == "cancelled" and report.body["cumulative_gpu_ms"] == 0
    assert not (job_dir / "ran").exists()
    assert not fake_server.seen("POST", f"{P}/attempts/92/started")


def test_start_on_a_gpu_the_node_lacks_is_refused(fake_server, run_agent, wait_for, job_dir) -> None:
    fake_server.add_start(93, f"touch {job_dir}/ran", gpus=[9])
    run_agent()
    (report,) = wait_for(lambda: fake_server.exits(93), what="exit report")
    # QA: "failed" ended the job for good for a fault of the node; "lost" spent a retry on it;
    # "refused": requeued at once, and the server drains the node.
    assert report.body["outcome"] == "refused" and report.body["exit_code"] is None
    assert not (job_dir / "ran").exists()


def test_agent_shutdown_kills_jobs_and_reports_them_lost(fake_server, run_agent, wait_for, job_dir) -> None:
    fake_server.add_start(94, f"echo $$ > {job_dir}/pid; sleep 30 & wait")
    running = run_agent()
    pid = int(
        wait_for(lambda: (job_dir / "pid").exists() and (job_dir / "pid").read_text().strip(), what="pid")
    )
    assert running.stop() == 0
    (report,) = fake_server.exits(94)
    assert report.body["outcome"] == "lost"
    assert report.body["cumulative_gpu_ms"] > 0
    assert _live_group_members(pid) == []  # nothing of the job's process group survives


def _live_group_members(pgid: int) -> list[int]:
    # Orphaned members are reparented to init, which may be slow to reap: zombies do not count.
    live = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            live.append(int(stat.parent.name))
    return live


def test_job_output_goes_to_the_state_dir(fake_server, run_agent, wait_for, tmp_path) -> None:
    fake_server.add_start(95, "echo hello; echo oops >&2")
    run_agent(state_dir=tmp_path)
    wait_for(lambda: fake_server.exits(95), what="exit report")
    assert Path(tmp_path / "jobs" / "attempt-95.log").read_text().split() == ["hello", "oops"]


def test_heartbeats_name_an_ended_attempt_until_its_exit_is_delivered(
    fake_server, run_agent, wait_for
) -> None:
    """Review: an attempt left out of every heartbeat is ended `lost` by the server after 5 minutes;
    while its exit report is being retried the agent still has it, so its heartbeats say so, with
    the report's own final seq and usage (nothing new)."""
    fake_server.add_start(71, "sleep 0.3; exit 0")
    fake_server.exit_status[71] = 503
    run_agent()
    wait_for(lambda: len(fake_server.exits(71, status=503)) >= 1, what="exit refused")
    beats = len(fake_server.heartbeats())
    wait_for(lambda: len(fake_server.heartbeats()) >= beats + 2, what="heartbeats while the exit waits")
    report = fake_server.exits(71, status=503)[0].body
    line = next(a for a in fake_server.heartbeats()[-1].body["attempts"] if a["attempt_id"] == 71)
    assert (line["seq"], line["cumulative_gpu_ms"]) == (report["seq"], report["cumulative_gpu_ms"]) != (0, 0)
    fake_server.exit_status[71] = 200
    wait_for(lambda: fake_server.exits(71), what="exit delivered")
    beats = len(fake_server.heartbeats())
    wait_for(lambda: len(fake_server.heartbeats()) >= beats + 2, what="heartbeats after delivery")
    assert all(a["attempt_id"] != 71 for a in fake_server.heartbeats()[-1].body["attempts"])
