"""The Result record: one benchmarked configuration, one versioned schema; and how the course
writes its numbers (seconds, their +-, memory, PSNR, the denoising a run used), in one place, so
a table, a chart, the playground and a summary line never disagree.

Introduced in 01_baseline.ipynb. The JSONL store that keeps Results is results/store.py. Imports
nothing of the package.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

# the start of the note course/planning/autotune.py gives a compile it ran without tuning (its
# AUTOTUNE_OFF; this module imports nothing of the package, tests/test_autotune.py ties the two)
AUTOTUNE_OFF = "autotuning is off:"
# the start of benchmark()'s note of a compile that read tuning of another GPU kind
TUNED_ON = "tuned on the "

__all__ = ["SCHEMA_VERSION", "Result", "ResultsFormatError", "median_interval", "STEADY"]

SCHEMA_VERSION = 1
# Timing is steady when the median is known within +-STEADY of itself (uncertainty()): runs are
# added until it is (until_steady, fdh.benchmark's max_runs), else flagged (Result.unsteady). The
# quiet 2-core CPU machine with the tiny models: 5 runs within +-3-10 %, so a few more settle it.
STEADY = 0.05


def median_interval(samples: list[float], confidence: float = 0.95
                    ) -> tuple[float, float, float]:
    """(low, high, coverage): the interval [x(k), x(n+1-k)] of the sorted samples that holds
    the true median with probability `coverage` (exact, binomial with p=1/2: no assumption on
    the distribution of the times), with the largest k whose coverage reaches `confidence`;
    with too few samples for that, (min, max) and its lower coverage (5 runs: 93.8 %)."""
    xs = sorted(samples)
    n = len(xs)
    if n == 0:
        raise ValueError("median_interval needs at least one sample")
    total = 2 ** n
    below = 0  # P(B <= k-1) * 2**n for B ~ Binomial(n, 1/2)
    best = (xs[0], xs[-1], 1 - 2 / total if n > 1 else 0.0)
    for k in range(1, (n + 1) // 2 + 1):
        below += math.comb(n, k - 1)
        coverage = 1 - 2 * below / total
        if coverage < confidence:
            break
        best = (xs[k - 1], xs[n - k], coverage)
    return best


def uncertainty(samples: list[float], median: float | None = None) -> float | None:
    """How far the median of `samples` (`median`, where given) may be off, as a share of it: the
    larger distance from it to an end of median_interval (0.04: +-4 %). None without 2+ samples
    or with a median of 0."""
    if len(samples) < 2:
        return None
    median = statistics.median(samples) if median is None else median
    low, high, _ = median_interval(samples)
    return max(median - low, high - median) / median if median else None


_REQUIRED = (
    "model", "weights", "step", "recipe", "device_name", "height", "width", "steps",
    "latency_s", "latency_samples", "cold_start_s", "peak_memory_bytes", "stages",
    "quality", "env", "error", "schema_version",
)
# Fields whose non-finite floats are stored as the strings "nan"/"inf"/"-inf" and restored on
# load. Elsewhere (recipe, env, notes) a string stays a string: a prompt may well be "nan".
_NUMERIC = (
    "guidance", "latency_s", "latency_samples", "cold_start_s", "stages", "stage_samples",
    "flops_per_image", "tflops_per_s", "quality", "cold_start_split", "load_s", "ops",
    "matmul_tflops", "wall_s",
)


class ResultsFormatError(ValueError):
    """A results file holds a record that is not a valid Result (names file and line)."""


def seconds_text(x: float | None) -> str:
    """3 significant figures, the unit left to the caller ('-' for nothing measured): how the
    course writes a time, in a Result's own lines and in results/' tables and charts."""
    if x is None:
        return "-"
    return f"{x:.1f}" if x >= 10 else f"{x:.2f}" if x >= 1 else f"{x:.3f}"


def uncertainty_text(result) -> str:
    """'+-4%': how far a Result's median may be off (Result.latency_uncertainty), '-' without
    two runs."""
    u = getattr(result, "latency_uncertainty", None)
    return "-" if u is None else f"+-{u:.0%}"


GIB = 2**30


def memory_text(b: int | None) -> str:
    if b is None:
        return "-"
    return f"{b / GIB:.2f} GiB" if b >= GIB else f"{b / 2**20:.0f} MiB"


def psnr_text(quality: dict | None) -> str:
    """'-' without a comparison, 'NaN image', 'identical' (infinite PSNR), else 'NN.N dB'."""
    psnr = (quality or {}).get("psnr")
    if psnr is None:
        return "-"
    if math.isnan(psnr):
        return "NaN image"
    return "identical" if math.isinf(psnr) else f"{psnr:.1f} dB"


def denoising_text(results) -> str:
    """'30 steps, EulerDiscrete' when every result ran the same steps and scheduler, else ''
    (then each result is labelled with denoising_label). Introduced in
    09_fewer_denoiser_calls.ipynb."""
    runs = {(r.steps, r.scheduler) for r in results}
    if len(runs) != 1:
        return ""
    steps, scheduler = next(iter(runs))
    name = f", {scheduler.removesuffix('Scheduler')}" if scheduler else ""  # older records: none
    return f"{steps} step" + ("" if steps == 1 else "s") + name


def denoising_label(result, results) -> str:
    """' (20 steps, UniPCMultistep)' for a result among others that ran other steps or another
    scheduler, else '': how a table or chart tells the runs of a scheduler swap apart."""
    if denoising_text(results):
        return ""
    return f" ({denoising_text([result])})"


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass
class Result:
    """One benchmarked configuration. Introduced in 01_baseline.ipynb.

    Times are seconds; ``latency_s`` is the median of ``latency_samples`` (steady state, after
    warm-up) and ``cold_start_s`` the first call (compile included). ``quality`` is the output
    of compare_images() against the baseline. Values must be JSON-compatible (str, int,
    float, bool, None, lists and str-keyed dicts) so the record can be stored.
    """

    model: str
    weights: str
    step: str
    recipe: dict
    device_name: str
    height: int
    width: int
    steps: int
    guidance: float | None = None
    seed: int = 0
    prompt: str = ""
    runs: int = 0
    warmup: int = 0
    latency_s: float | None = None
    latency_samples: list[float] = field(default_factory=list)
    cold_start_s: float | None = None
    peak_memory_bytes: int | None = None
    peak_memory_kind: str | None = None  # "cuda_max_allocated" or "process_peak_rss"
    # CUDA only: the caching allocator's peak reserved bytes. CUDA-graph memory pools (compile
    # "max-autotune", "reduce-overhead") hold memory that max allocated does not show. Added
    # within schema 1: records written before it load with None.
    peak_reserved_bytes: int | None = None
    stages: dict = field(default_factory=dict)  # stage -> median seconds
    stage_samples: dict = field(default_factory=dict)  # stage -> [seconds, ...]
    flops_per_image: float | None = None
    tflops_per_s: float | None = None
    quality: dict | None = None
    env: dict = field(default_factory=dict)
    error: str | None = None
    notes: list[str] = field(default_factory=list)
    # what ran besides the recipe: the VAE's source ("pipeline": the pipeline's own), the
    # scheduler class, and TF32 as torch used it (techniques.precision.tf32_state)
    vae: str | None = None
    scheduler: str | None = None
    tf32: dict = field(default_factory=dict)
    # compilation seen by benchmark(): frames compiled in the cold start ("cold": events dict),
    # per warm-up and per timed call ("warmup", "timed": frame counts), extra warm-up calls
    compile_events: dict = field(default_factory=dict)
    cold_start_split: dict = field(default_factory=dict)  # compile_s, dynamo_s, ..., denoising_over_warm_s
    load_s: float | None = None  # load_pipeline + apply, where run_ladder measured it
    # the reference run (tools/reference/run.py), within schema 1 (older records load with None): the
    # device's dense matmul rate measured for the folder (bf16 on CUDA, fp32 on a CPU), and the
    # step's whole wall time (load, apply, warm-ups, timed runs)
    matmul_tflops: float | None = None
    wall_s: float | None = None
    # benchmark(profile=True): seconds per image of the ops that took most time in one extra,
    # untimed, profiled call (self time; the device's on CUDA). Added within schema 1.
    ops: dict = field(default_factory=dict)
    created_at: str = ""
    image_path: str | None = None
    schema_version: int = SCHEMA_VERSION
    image: Any = field(default=None, repr=False, compare=False)  # never stored

    def __post_init__(self) -> None:
        if not self.created_at:
            self.created_at = utc_now()

    @property
    def latency_iqr_s(self) -> float:
        """Interquartile range of the samples (inclusive method: stays inside the data), the
        course's one measure of spread: tables print it, charts draw it as whiskers."""
        q1, q3 = self.latency_quartiles_s
        return q3 - q1

    @property
    def latency_quartiles_s(self) -> tuple[float, float]:
        """(first, third) quartile of the samples; the median twice with fewer than 2."""
        if len(self.latency_samples) < 2:
            return (self.latency_s or 0.0, self.latency_s or 0.0)
        q1, _, q3 = statistics.quantiles(self.latency_samples, n=4, method="inclusive")
        return q1, q3

    @property
    def latency_interval_s(self) -> tuple[float, float, float] | None:
        """(low, high, coverage) of the median (record.median_interval); None without 2+
        samples."""
        if len(self.latency_samples) < 2:
            return None
        return median_interval(self.latency_samples)

    @property
    def latency_uncertainty(self) -> float | None:
        """How far the median may be off, as a share of it: uncertainty() of the samples
        around latency_s (0.04: +-4 %). None without 2+ samples."""
        return uncertainty(self.latency_samples, self.latency_s) if self.latency_s else None

    @property
    def unsteady(self) -> bool:
        """The median is not known within +-STEADY (a busy machine, a call whose time varies):
        the number is shown with its uncertainty, not as a clean speed. Needs 3+ samples
        (smoke mode's 2 runs say too little either way; the table still shows their +-)."""
        u = self.latency_uncertainty
        return len(self.latency_samples) >= 3 and u is not None and u > STEADY

    @property
    def matmul_share(self) -> float | None:
        """Achieved TFLOP/s as a share of the device's measured dense matmul rate, or None."""
        if not self.tflops_per_s or not self.matmul_tflops:
            return None
        return self.tflops_per_s / self.matmul_tflops

    @property
    def compiled_during_timing(self) -> bool:
        """True when a timed call compiled something: its samples include compilation."""
        return any(self.compile_events.get("timed", []))

    @property
    def flags(self) -> list[str]:
        """Warnings a reader of this result's numbers must see (tables, charts, playground)."""
        flags = ["compiled while timed"] if self.compiled_during_timing else []
        if any(note.startswith(AUTOTUNE_OFF) for note in self.notes):
            flags.append("not autotuned: the recipe's max-autotune ran in default mode "
                         "(autotuning off)")
        flags += [note.partition(":")[0] for note in self.notes if note.startswith(TUNED_ON)]
        if self.unsteady:
            low, high, coverage = self.latency_interval_s
            flags.append(f"uncertain timing (median +-{self.latency_uncertainty:.0%}: "
                         f"{low:.3g}-{high:.3g} s, {coverage:.0%} interval of "
                         f"{len(self.latency_samples)} runs)")
        return flags

    @property
    def ok(self) -> bool:
        return self.error is None

    def timing_text(self) -> str:
        """'0.123 s +-4% (median of 5)': the median with how far it may be off, and the
        coverage of that interval where it is below 90 % (2 runs: 50 %); one run says so.
        Introduced in 05_cold_start.ipynb."""
        u = uncertainty_text(self)
        if u == "-":
            return f"{seconds_text(self.latency_s)} s (one run: no +-)"
        coverage = self.latency_interval_s[2]
        sure = "" if coverage >= 0.9 else f", an interval of {coverage:.0%} only"
        return f"{seconds_text(self.latency_s)} s {u} (median of {len(self.latency_samples)}{sure})"

    def speedup_over(self, before: Result) -> str:
        """How many times faster this ran than `before`, with the range the two medians'
        intervals allow (latency_interval_s): '2.31x (2.05-2.60x, from the medians'
        intervals)'; a side with one run gives no range. Introduced in 04_torch_compile.ipynb."""
        ratio = f"{before.latency_s / self.latency_s:.2f}x"
        a, b = before.latency_interval_s, self.latency_interval_s
        if a is None or b is None:
            return ratio + " (one run on a side: no range)"
        return f"{ratio} ({a[0] / b[1]:.2f}-{a[1] / b[0]:.2f}x, from the medians' intervals)"

    def summary(self) -> str:
        """One line, e.g. 'sdxl bf16: 4.63 s (median of 5, +-1%, IQR 0.01 s), cold start 12.3 s, peak 9.1 GiB'."""
        head = f"{self.model} {self.step}"
        if self.error is not None:
            return f"{head}: FAILED: {self.error}"
        if self.latency_s is None:
            parts = ["no timing"]
        else:
            sure = "" if (u := uncertainty_text(self)) == "-" else f", {u}"
            parts = [
                f"{self.latency_s:.2f} s (median of {len(self.latency_samples)}{sure}, "
                f"IQR {self.latency_iqr_s:.2f} s)"
            ]
        if self.cold_start_s is not None:
            parts.append(f"cold start {self.cold_start_s:.1f} s")
        if self.peak_memory_bytes is not None:
            parts.append(f"peak {self.peak_memory_bytes / 2**30:.1f} GiB")
        if self.peak_reserved_bytes is not None:
            parts.append(f"reserved {self.peak_reserved_bytes / 2**30:.1f} GiB")  # CUDA
        return f"{head}: " + ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """Plain, JSON-safe dict of every stored field (the image is left out)."""
        return {f.name: _encode(getattr(self, f.name), f.name)
                for f in dataclasses.fields(self) if f.name != "image"}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Result:
        """Build a Result from to_dict()'s output, checking keys and schema version."""
        if not isinstance(d, dict):
            raise ValueError(f"a result record must be a JSON object, got {type(d).__name__}")
        missing = [k for k in _REQUIRED if k not in d]
        if missing:
            raise ValueError(f"missing required keys {missing}")
        if d["schema_version"] != SCHEMA_VERSION:
            raise ValueError(
                f"schema_version {d['schema_version']!r} is not supported; this version of "
                f"fastdiff_helpers reads schema_version {SCHEMA_VERSION} only. Upgrade "
                "fastdiff_helpers, or re-run the benchmark to write a current record."
            )
        known = {f.name for f in dataclasses.fields(cls)} - {"image"}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown keys {unknown}; expected only {sorted(known)}")
        for key, types in (("model", str), ("weights", str), ("step", str), ("device_name", str),
                           ("height", int), ("width", int), ("steps", int), ("recipe", dict),
                           ("stages", dict), ("env", dict), ("latency_samples", list)):
            if not isinstance(d[key], types) or isinstance(d[key], bool):
                raise ValueError(f"{key!r} must be {types.__name__}, got {d[key]!r}")
        kwargs = {k: (_decode(v) if k in _NUMERIC else v) for k, v in d.items()}
        return cls(**kwargs)


def _encode(value: Any, where: str) -> Any:
    """Deep-copy into JSON types; non-finite floats become 'nan'/'inf'/'-inf'."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else str(float(value))  # "nan", "inf", "-inf"
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"Result.{where} has a non-string key {k!r}; use str keys")
            out[k] = _encode(v, f"{where}[{k!r}]")
        return out
    if isinstance(value, (list, tuple)):
        return [_encode(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if hasattr(value, "item") and callable(value.item):  # numpy / torch scalar
        return _encode(value.item(), where)
    raise TypeError(
        f"Result.{where} holds a {type(value).__name__}, which cannot be stored as JSON; "
        "convert it to str, int, float, list or dict first"
    )


def _decode(value: Any) -> Any:
    if isinstance(value, str) and value in ("nan", "inf", "-inf"):  # as _encode wrote them
        return float(value)
    if isinstance(value, dict):
        return {k: _decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value
