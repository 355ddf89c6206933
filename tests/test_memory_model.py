"""fdh.course.peak_bytes' activations from each model's measured or published peak (issue 51), and its
checks of the input."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import fastdiff_helpers as fdh
from fastdiff_helpers.course.planning.gpus import PROFILES as GPU_PROFILES
from fastdiff_helpers.course.planning import gpus, sizing
from fastdiff_helpers.models import fit
from fastdiff_helpers.course.planning.published import PEAKS_GIB
from fastdiff_helpers.course.planning.sizing import card_fit

ROOT = Path(__file__).resolve().parent.parent
GIB = 1024 ** 3
T4 = GPU_PROFILES["t4"]


def _measured() -> dict[tuple[str, str], list[int]]:
    """(model, "fp32" | "half") -> measured and published peaks in bytes."""
    out: dict[tuple[str, str], list[int]] = {}
    for line in (ROOT / "results/h100-80gb-hbm3/sdxl/results.jsonl").read_text().splitlines():
        row = json.loads(line)
        dtype = row["recipe"]["dtype"]
        out.setdefault(("sdxl", "fp32" if dtype == "fp32" else "half"), []).append(
            row["peak_memory_bytes"])
    for key, (gib, _) in PEAKS_GIB.items():
        out.setdefault(key, []).append(int(gib * GIB))
    return out


def test_activations_are_the_largest_measured_or_published_peak_less_the_weights():
    for (model, group), peaks in _measured().items():
        weights = fit.weight_bytes_of(model, "fp32" if group == "fp32" else "bf16")
        assert fit.ACT_BYTES[model, group] == pytest.approx(max(peaks) - weights, rel=1e-3)


def test_every_measured_or_published_peak_is_under_the_estimate_and_near_it():
    for (model, group), peaks in _measured().items():
        estimate = fit.peak_bytes(model, "fp32" if group == "fp32" else "bf16")
        for peak in peaks:
            assert peak < estimate <= 1.3 * peak, (model, group, peak / GIB, estimate / GIB)


def test_ssd1b_in_fp32_fits_a_t4():
    """diffusion-fast published SSD-1B's fp32 peak at 12.19 GiB (max_memory_allocated); with
    the margin and the CUDA context it fits the T4's 14.8 GiB, and the T4 runs its fp32 rungs."""
    assert gpus.fits(T4, "ssd1b", "fp32")[0]
    assert sizing.card_fit(T4, "ssd1b").fp32_fits
    assert not gpus.fits(T4, "sdxl", "fp32")[0]


@pytest.mark.parametrize("call, said", [
    (lambda: fdh.course.peak_bytes("sdxl", "fp64"), "dtype='fp64' cannot work: use one of fp32, tf32"),
    (lambda: fdh.course.peak_bytes("sdxl", "bf16", -1024), "height=-1024 cannot work"),
    (lambda: fdh.course.peak_bytes("sdxl", "bf16", 1024, 0), "width=0 cannot work"),
    (lambda: fdh.course.peak_bytes("sdxl", "bf16", 1001), "height=1001 cannot work: this model needs"),
    (lambda: fdh.course.peak_bytes("sdxl", "bf16", batch=0), "batch=0 cannot work"),
    (lambda: fdh.course.peak_bytes("sdxl", "bf16", batch=-2), "batch=-2 cannot work"),
    (lambda: card_fit(T4, "sdxl", 0), "size=0 cannot work"),
    (lambda: card_fit(T4, "sdxl", -512), "size=-512 cannot work"),
])
def test_bad_sizes_batches_and_dtypes_are_one_clear_line(call, said):
    with pytest.raises(fdh.FastdiffError, match=re.escape(said)) as caught:
        call()
    assert "\n" not in str(caught.value)
