"""metrics: each device's timings wait for its queued work, and its memory figure says what it is."""

import pytest
import torch

from fastdecode.engine import timing as metrics


@pytest.fixture
def fake_mps(monkeypatch):
    """The torch.mps calls metrics makes, recorded (CPU builds have the functions but no device)."""
    calls = []
    monkeypatch.setattr(torch.mps, "synchronize", lambda: calls.append("synchronize"))
    monkeypatch.setattr(torch.mps, "empty_cache", lambda: calls.append("empty_cache"))
    monkeypatch.setattr(torch.mps, "driver_allocated_memory", lambda: 123 << 20)
    return calls


def test_mps_timings_synchronize(fake_mps):
    metrics.now(torch.device("mps"))
    assert fake_mps == ["synchronize"]


def test_mps_memory_is_the_drivers(fake_mps):
    mps = torch.device("mps")
    metrics.reset_peak_memory(mps)
    assert fake_mps == ["empty_cache"]
    assert metrics.peak_memory_bytes(mps) == 123 << 20
    assert metrics.memory_source(mps) == "torch.mps.driver_allocated_memory"


def test_cpu_memory_is_the_process_rss(fake_mps):
    cpu = torch.device("cpu")
    metrics.reset_peak_memory(cpu)
    metrics.synchronize(cpu)
    assert fake_mps == []  # nothing device-specific on CPU
    assert metrics.peak_memory_bytes(cpu) > 0 and metrics.memory_source(cpu) == "process RSS"
