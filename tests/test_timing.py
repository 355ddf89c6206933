"""time_call() and benchmark() synchronise around every timed call, and benchmark() times
only the calls after warm-up (issue 13).

Without a GPU, synchronize() does nothing visible, so a spy replaces it (and the clock that
bench.py reads) and records the order of events: a timed call must read as
sync, clock, call, sync, clock. A fake clock that each pipeline call advances by a known
amount shows which calls land in latency_samples and cold_start_s."""

from types import SimpleNamespace

import pytest
import torch

import fastdiff_helpers as fdh
import fastdiff_helpers.measure.bench as bench

TIMED = ["sync", "clock", "call", "sync", "clock"]


@pytest.fixture
def spied(monkeypatch):
    """Events in order: "sync" (bench.synchronize), "clock" (bench's perf_counter, read
    outside a pipeline call) and "call"; `advance(s)` moves the fake clock."""
    state = SimpleNamespace(events=[], now=1000.0, in_call=False, devices=[])

    def synchronize(device):
        state.devices.append(torch.device(device))
        state.events.append("sync")

    def perf_counter():
        if not state.in_call:  # the stage marks read the clock inside a call too
            state.events.append("clock")
        return state.now

    monkeypatch.setattr(bench, "synchronize", synchronize)
    monkeypatch.setattr(bench, "time", SimpleNamespace(perf_counter=perf_counter))
    return state


def test_time_call_synchronises_before_and_after_the_call(spied):
    def fn():
        spied.events.append("call")
        spied.now += 2.5
        return "out"

    assert bench.time_call(fn, "cuda:1") == ("out", 2.5)
    assert spied.events == TIMED
    assert spied.devices == [torch.device("cuda:1")] * 2


def test_benchmark_synchronises_around_every_timed_call_and_times_only_those(spied,
                                                                               monkeypatch):
    pipe = fdh.load_pipeline("sd15", weights="tiny", device="cpu")
    cls = type(pipe)
    original = cls.__call__
    # cold start 100 s, warm-up calls 10 s, then the timed calls 1 s, 2 s, 3 s
    durations = iter([100.0, 10.0, 10.0, 1.0, 2.0, 3.0])

    def call(self, *args, **kwargs):
        spied.events.append("call")
        spied.in_call = True
        try:
            out = original(self, *args, **kwargs)
        finally:
            spied.in_call = False
        spied.now += next(durations)
        return out

    monkeypatch.setattr(cls, "__call__", call)
    result = bench.benchmark(pipe, steps=2, runs=3, warmup=3, progress=False, max_runs=3)
    assert spied.events == TIMED + ["call", "call"] + TIMED * 3
    assert set(spied.devices) == {torch.device("cpu")}
    assert result.cold_start_s == 100.0
    assert result.latency_samples == [1.0, 2.0, 3.0] and result.latency_s == 2.0
    assert next(durations, None) is None  # exactly 1 + 2 + 3 calls


def test_naive_time_is_the_unsynchronised_mistake(spied, monkeypatch):
    from fastdiff_helpers.course import naive

    monkeypatch.setattr(naive, "time", bench.time)  # the fixture's fake clock
    pipe = fdh.load_pipeline("sd15", weights="tiny", device="cpu")
    fdh.course.naive_time(pipe, steps=2, runs=2)
    assert "sync" not in spied.events and spied.events.count("clock") == 4


def test_synchronize_waits_for_the_cuda_device_only(monkeypatch):
    waited = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: waited.append(device))
    bench.synchronize("cpu")
    bench.synchronize(torch.device("meta"))
    assert waited == []
    bench.synchronize("cuda:1")
    bench.synchronize(torch.device("cuda", 0))
    assert waited == [torch.device("cuda:1"), torch.device("cuda:0")]
