"""GPU discovery (NVML when present, ``--fake-gpus`` otherwise) and per-attempt GPU sampling."""

from __future__ import annotations

import importlib
import logging
import re
import uuid
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol

log = logging.getLogger("agent.gpus")

# Memory of the fake models we know; an unknown model is an error rather than a guess, because the
# scheduler places jobs on the memory floor and a wrong number would mis-place real work in a demo.
FAKE_MEMORY_GB: dict[str, int] = {"H100": 80, "A100": 80, "L4": 24, "T4": 16}

_FAKE_SPEC = re.compile(r"^\s*(\d+)\s*[xX]\s*([A-Za-z0-9]+)\s*$")
# NVML names look like "NVIDIA H100 80GB HBM3"; the service prices by the short model name.
_MODEL_IN_NAME = re.compile(r"\b(B200|H200|H100|A100|A10G|A10|L40S|L40|L4|T4|V100)\b", re.IGNORECASE)


class GpuError(Exception):
    """No usable GPU inventory (bad --fake-gpus spec, or no NVML and no fake spec)."""


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as registered with the server."""

    index: int
    model: str
    memory_gb: int
    uuid: str

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "model": self.model, "memory_gb": self.memory_gb, "uuid": self.uuid}


class GpuSampler(Protocol):
    """Reads utilisation for the GPUs of one attempt; informational only, never billed."""

    def sample(self, gpu_indices: tuple[int, ...]) -> tuple[float, int]:
        """Return (mean utilisation 0-100, memory used in MB summed over the GPUs)."""
        ...


class FakeSampler:
    """Fake GPUs do no work, so they honestly report zero utilisation and memory."""

    def sample(self, gpu_indices: tuple[int, ...]) -> tuple[float, int]:
        return 0.0, 0


def parse_fake_gpus(spec: str, hostname: str) -> list[GpuInfo]:
    """Parse ``8xH100`` into GPUs with UUIDs that are stable across restarts of the same host."""
    match = _FAKE_SPEC.match(spec)
    if not match:
        raise GpuError(f"--fake-gpus must look like 8xH100, got {spec!r}")
    count, model = int(match.group(1)), match.group(2).upper()
    if count < 1:
        raise GpuError("--fake-gpus needs at least one GPU")
    if model not in FAKE_MEMORY_GB:
        known = ", ".join(sorted(FAKE_MEMORY_GB))
        raise GpuError(f"unknown fake GPU model {model!r} (known: {known})")
    # Deterministic UUIDs: a restarted agent re-registers the same devices, not new ones.
    return [
        GpuInfo(
            index=i,
            model=model,
            memory_gb=FAKE_MEMORY_GB[model],
            uuid=f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, f'gpubank-fake://{hostname}/{i}/{model}')}",
        )
        for i in range(count)
    ]


def short_model(name: str) -> str:
    match = _MODEL_IN_NAME.search(name)
    return match.group(1).upper() if match else name.strip()


def _load_nvml() -> ModuleType | None:
    # Imported lazily: most dev machines and CI have no pynvml, and the agent must still start there.
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        return None


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class NvmlSampler:
    """Utilisation from NVML; errors degrade to zeros because a metric must never stop a heartbeat."""

    def __init__(self, nvml: ModuleType) -> None:
        self._nvml = nvml

    def sample(self, gpu_indices: tuple[int, ...]) -> tuple[float, int]:
        if not gpu_indices:
            return 0.0, 0
        util, mem_mb = 0.0, 0
        try:
            for index in gpu_indices:
                handle = self._nvml.nvmlDeviceGetHandleByIndex(index)
                util += float(self._nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
                mem_mb += int(self._nvml.nvmlDeviceGetMemoryInfo(handle).used) // (1024 * 1024)
        except Exception as exc:
            log.debug("NVML sample failed: %s", exc, extra={"attempt": "-"})
            return 0.0, 0
        return util / len(gpu_indices), mem_mb


def detect_nvml() -> tuple[list[GpuInfo], NvmlSampler] | None:
    """Real GPUs via NVML, or None when NVML is missing or sees no devices."""
    nvml = _load_nvml()
    if nvml is None:
        return None
    try:
        nvml.nvmlInit()
        gpus = []
        for i in range(int(nvml.nvmlDeviceGetCount())):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            total = int(nvml.nvmlDeviceGetMemoryInfo(handle).total)
            gpus.append(
                GpuInfo(
                    index=i,
                    model=short_model(_text(nvml.nvmlDeviceGetName(handle))),
                    memory_gb=round(total / 1024**3),
                    uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                )
            )
    except Exception as exc:
        log.warning("NVML unavailable: %s", exc, extra={"attempt": "-"})
        return None
    return (gpus, NvmlSampler(nvml)) if gpus else None


def discover(fake_spec: str | None, hostname: str) -> tuple[list[GpuInfo], GpuSampler]:
    """An explicit --fake-gpus wins (demo fleets run on GPU hosts too); otherwise NVML is required."""
    if fake_spec:
        return parse_fake_gpus(fake_spec, hostname), FakeSampler()
    found = detect_nvml()
    if found is None:
        raise GpuError("no GPUs found via NVML (is pynvml installed?); pass --fake-gpus e.g. 8xH100")
    gpus, sampler = found
    return gpus, sampler
