"""max-autotune's tuning on a CPU, in a new process: the experiment behind 05_cold_start's
"ship the tuning" section, small enough to run anywhere.

Introduced in 05_cold_start.ipynb. On a CPU inductor benchmarks GEMM choices only for frozen
weights with its C++ template backend (torch/_inductor/config.py: freezing,
max_autotune_gemm_backends; without them the course's CPU compiles tune nothing), so the child
process sets both and compiles two Linears of different shapes: two shapes to tune, each with
an ATen (MKL) and a C++ choice. It reports how many shapes it benchmarked and each shape's
winner, read through torch's own hook (select_algorithm.add_feedback_saver, called with the
timings whether they were measured or came from the cache).

    python -m fastdiff_helpers.course.compiletime.tuning_cpu CACHE_DIR [--import BUNDLE] [--export BUNDLE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ... import checks
from ...errors import FastdiffError
from .bundle_io import export_tuning, import_tuning
from ..planning.writes import output_folder

__all__ = ["cpu_tuning_run"]


def cpu_tuning_run(cache_dir: str | os.PathLike, bundle_in: str | os.PathLike | None = None,
                   bundle_out: str | os.PathLike | None = None, timeout_s: float = 900
                   ) -> dict[str, Any]:
    """Compile two Linears with CPU max-autotune in a new process whose compile cache is
    `cache_dir`, after importing `bundle_in` (fdh.course.import_tuning) if given, and export the
    tuning to `bundle_out` if given. Returns {"autotunes": shapes benchmarked, "winners":
    {shape: winning choice}, "compile_s": the compile's seconds, "process_s": the new
    process's seconds to the end, "export": export_tuning's summary or None}.
    Introduced in docs/instructor.md."""
    cache = output_folder("cache_dir", cache_dir)
    args = [str(cache)]
    if bundle_in is not None:
        args += ["--import", str(checks.existing("bundle_in", bundle_in, "a tuning bundle"))]
    if bundle_out is not None:
        args += ["--export", str(checks.output_file("bundle_out", bundle_out, "toy.json.gz"))]
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(Path(cache).absolute()),
               OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", __name__, *args], env=env,
                          capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise FastdiffError(f"the CPU tuning run failed: {tail}")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    return dict(report, process_s=time.perf_counter() - started)


def _main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cache_dir")
    parser.add_argument("--import", dest="bundle_in", default=None)
    parser.add_argument("--export", dest="bundle_out", default=None)
    args = parser.parse_args()

    import torch
    import torch._inductor.config as inductor_config
    from torch._dynamo.utils import counters
    from torch._inductor import select_algorithm

    if args.bundle_in:
        import_tuning(args.bundle_in, cache_dir=args.cache_dir, verbose=False)
    winners: dict[str, str] = {}

    def saver(timings, name, input_nodes, choices, profiled, precompile_times):
        best = min(timings, key=timings.get)
        shape = "x".join(str(s) for s in input_nodes[0].get_size())
        winners[shape] = best.name

    select_algorithm.add_feedback_saver(saver)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(),
                                torch.nn.Linear(512, 256)).eval()
    started = time.perf_counter()
    with inductor_config.patch(freezing=True, max_autotune_gemm_backends="CPP,ATEN"):
        compiled = torch.compile(model, mode="max-autotune-no-cudagraphs")
        with torch.no_grad():
            compiled(torch.randn(64, 256))
    compile_s = time.perf_counter() - started
    exported = (export_tuning(args.bundle_out, model="toy", cache_dir=args.cache_dir,
                              verbose=False) if args.bundle_out else None)
    print(json.dumps({"autotunes": counters["inductor"]["select_algorithm_autotune"],
                      "winners": winners, "compile_s": compile_s, "export": exported}))


if __name__ == "__main__":
    _main()
