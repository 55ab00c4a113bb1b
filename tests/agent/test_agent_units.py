"""Pure pieces of the agent: GPU specs, response classification, backoff, outbox, client, CLI."""

from __future__ import annotations

import email.utils
import json
import time
from pathlib import Path

import httpx
import pytest

from agent.__main__ import build_parser
from agent.client import ApiClient, Outcome, backoff_delay, classify, parse_retry_after
from agent.gpus import FakeSampler, GpuError, discover, parse_fake_gpus, short_model
from agent.outbox import Outbox
from agent.runner import ExitRecord, Runner, StartSpec, StopRequest


def test_fake_gpus_spec_and_memory() -> None:
    gpus = parse_fake_gpus("8xH100", "host-1")
    assert [(g.index, g.model, g.memory_gb) for g in gpus] == [(i, "H100", 80) for i in range(8)]
    assert [g.memory_gb for g in parse_fake_gpus("4xa100", "h")] == [80] * 4
    assert parse_fake_gpus("2xL4", "h")[0].memory_gb == 24
    assert parse_fake_gpus("1xT4", "h")[0].memory_gb == 16
    # Stable across restarts of one host, distinct across hosts.
    assert [g.uuid for g in parse_fake_gpus("8xH100", "host-1")] == [g.uuid for g in gpus]
    assert parse_fake_gpus("1xH100", "host-2")[0].uuid != gpus[0].uuid


@pytest.mark.parametrize("spec", ["8xZ100", "H100", "0xH100", "x", "8x"])
def test_bad_fake_gpus_spec_is_an_error(spec) -> None:
    with pytest.raises(GpuError):
        parse_fake_gpus(spec, "h")


def test_without_nvml_or_fake_gpus_discovery_fails(monkeypatch) -> None:
    monkeypatch.setattr("agent.gpus._load_nvml", lambda: None)
    with pytest.raises(GpuError, match="--fake-gpus"):
        discover(None, "h")
    gpus, sampler = discover("2xL4", "h")
    assert len(gpus) == 2 and isinstance(sampler, FakeSampler)


def test_nvml_names_are_shortened_to_models() -> None:
    assert short_model("NVIDIA H100 80GB HBM3") == "H100"
    assert short_model("NVIDIA A100-SXM4-80GB") == "A100"
    assert short_model("Tesla T4") == "T4"
    assert short_model("NVIDIA L4") == "L4"
    assert short_model("Mystery GPU") == "Mystery GPU"


@pytest.mark.parametrize(
    ("status", "outcome"),
    [
        (200, Outcome.OK),
        (204, Outcome.OK),
        (409, Outcome.CONFLICT),
        (408, Outcome.RETRY),
        (429, Outcome.RETRY),
        (500, Outcome.RETRY),
        (503, Outcome.RETRY),
        (400, Outcome.DROP),
        (401, Outcome.DROP),
        (404, Outcome.DROP),
        (422, Outcome.DROP),
    ],
)
def test_status_classification(status, outcome) -> None:
    assert classify(status) is outcome


def test_retry_after_parsing() -> None:
    assert parse_retry_after("5") == 5.0
    assert parse_retry_after("99999") == 600.0
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    now = time.time()
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert 28 <= parse_retry_after(date, now=now) <= 31
    assert parse_retry_after(email.utils.formatdate(now - 30, usegmt=True), now=now) == 0.0


def test_backoff_grows_is_capped_jittered_and_respects_retry_after() -> None:
    low = [backoff_delay(n, base=1, cap=60, rng=lambda: 0.0) for n in range(1, 9)]
    high = [backoff_delay(n, base=1, cap=60, rng=lambda: 1.0) for n in range(1, 9)]
    assert low == [0.5, 1, 2, 4, 8, 16, 30, 30]
    assert high == [1, 2, 4, 8, 16, 32, 60, 60]
    assert backoff_delay(1, base=1, cap=60, retry_after=7, rng=lambda: 1.0) == 7


def test_outbox_persists_first_report_per_attempt_and_survives_reload(tmp_path) -> None:
    path = tmp_path / "state" / "outbox.json"
    box = Outbox(path)
    assert box.add(ExitRecord(5, 3, 1200, 0, None, "completed"))
    assert not box.add(ExitRecord(5, 9, 9999, 1, None, "failed"))  # first report wins
    box.add(ExitRecord(6, 0, 0, None, None, "lost"))
    reloaded = Outbox(path)
    assert reloaded.ids() == [5, 6]
    assert reloaded.due(0.0)[0].body == {
        "seq": 3,
        "cumulative_gpu_ms": 1200,
        "exit_code": 0,
        "signal": None,
        "outcome": "completed",
    }
    reloaded.postpone(5, until=100.0)
    assert [e.attempt_id for e in reloaded.due(50.0)] == [6]
    reloaded.remove(5)
    assert Outbox(path).ids() == [6]
    assert [p.name for p in path.parent.iterdir()] == ["outbox.json"]  # no temp files left


def test_corrupt_outbox_is_set_aside_not_lost(tmp_path) -> None:
    path = tmp_path / "outbox.json"
    path.write_text("{not json")
    box = Outbox(path)
    assert len(box) == 0
    (aside,) = tmp_path.glob("outbox.json.corrupt-*")
    assert aside.read_text() == "{not json"


def test_client_sends_bearer_token_and_classifies_failures() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path.endswith("/exit"):
            return httpx.Response(503, headers={"Retry-After": "3"}, json={"detail": "db down"})
        return httpx.Response(200, json={"start": [], "stop": []})

    client = ApiClient("http://server", "tok", timeout=1, transport=httpx.MockTransport(handler))
    assert client.assignments().body == {"start": [], "stop": []}
    result = client.exit(12, {"seq": 1})
    assert (result.outcome, result.retry_after, result.error) == (Outcome.RETRY, 3.0, "db down")
    assert seen[1].url.path == "/api/v1/agent/attempts/12/exit"
    assert json.loads(seen[1].content) == {"seq": 1}
    assert {r.headers["Authorization"] for r in seen} == {"Bearer tok"}


def test_unreachable_server_is_retryable() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    client = ApiClient("http://server", "tok", timeout=1, transport=httpx.MockTransport(handler))
    result = client.heartbeats({"attempts": []})
    assert result.outcome is Outcome.RETRY and result.unreachable


def test_cli_flags() -> None:
    args = build_parser().parse_args(
        [
            "--server",
            "http://s",
            "--token",
            "t",
            "--fake-gpus",
            "8xH100",
            "--heartbeat-interval",
            "1",
            "--region",
            "eu",
            "--hostname",
            "n1",
            "--nvlink-domain",
            "d",
            "--ib-group",
            "g",
            "--state-dir",
            "/tmp/x",
        ]
    )
    assert (args.fake_gpus, args.heartbeat_interval, args.region, args.hostname) == (
        "8xH100",
        1.0,
        "eu",
        "n1",
    )
    assert (args.nvlink_domain, args.ib_group, str(args.state_dir)) == ("d", "g", "/tmp/x")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--server", "http://s", "--heartbeat-interval", "0"])


def test_runner_remembers_an_exited_attempt_until_its_exit_is_collected(wait_for) -> None:
    # The supervisor thread can reap a job between two polls of the main loop; a repeated start in
    # that window must not spawn it again, and a late stop must not be taken for a stranger.
    runner = Runner(timeout_grace=0.1)
    spec = StartSpec(attempt_id=1, job_id=2, command="true", gpu_indices=(0,), max_wall_seconds=10)
    assert runner.start(spec)
    wait_for(lambda: (runner.supervise_once(), not runner.is_running(1))[1], what="job reaped")
    assert not runner.start(spec)
    assert runner.stop(StopRequest(1, "cancelled", 1.0))
    (record,) = runner.take_exits()
    assert (record.attempt_id, record.outcome, record.exit_code, record.seq) == (1, "completed", 0, 1)
    assert not runner.stop(StopRequest(1, "cancelled", 1.0))


def test_outbox_keeps_reports_in_memory_when_the_state_dir_is_unwritable(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    box = Outbox(blocker / "outbox.json")
    assert box.add(ExitRecord(3, 1, 10, 0, None, "completed"))
    assert box.ids() == [3]
    box.remove(3)
    assert len(box) == 0


def test_a_run_that_exits_at_once_never_reports_negative_usage() -> None:
    """QA: the supervisor read its clock, then a start registered under the lock stamped a later
    start time; the run exited at once and its usage came out -1 ms, which the server refused (400)
    and the agent dropped: the job stayed `running` for good. Clocks are read under the lock now,
    and a figure below zero is 0."""

    class Clock:
        value = 100.002

        def __call__(self) -> float:
            return self.value

    clock = Clock()
    runner = Runner(timeout_grace=5, clock=clock)
    runner.start(StartSpec(attempt_id=1, job_id=1, command="true", gpu_indices=(0,), max_wall_seconds=60))
    time.sleep(0.3)  # `true` has exited
    clock.value = 100.0  # as the supervisor's stale reading
    runner.supervise_once()
    [record] = runner.take_exits()
    assert (record.attempt_id, record.cumulative_gpu_ms, record.outcome) == (1, 0, "completed")
