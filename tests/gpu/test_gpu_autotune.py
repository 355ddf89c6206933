"""Coordinate descent runs once per kernel (issue 44, item 3), on a CUDA GPU in about a minute:
`pytest tests/gpu -m gpu -k autotune`.

Three new processes compile the same small module with coordinate descent on (the blog's flag),
each with its own empty compile cache and four compile workers, so that every Triton kernel is
compiled in a worker and pickled back to the parent (torch/_inductor/runtime/compile_tasks.py):
1. tunes and exports its tuning as a bundle (fdh.course.export_tuning);
2. imports the bundle, with the course's patch (fdh.course.planning.coordesc.keep_coordesc_marks):
   it must time no coordinate-descent config at all;
3. imports it without the patch: the control, printed (on a torch with pytorch#172819 it
   descends again from the imported configs).
Skipped without CUDA."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

CHILD = r"""
import json, sys
import torch
import fastdiff_helpers as fdh
from fastdiff_helpers.course.planning import coordesc
from torch._dynamo.utils import counters

what, bundle, keep = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
if keep:
    patched = coordesc.keep_coordesc_marks()
else:
    patched = False
if what == "again":
    fdh.course.import_tuning(bundle, verbose=False)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.LayerNorm(1024), torch.nn.GELU(), torch.nn.Linear(1024, 1024),
                            torch.nn.Softmax(dim=-1)).cuda().eval()
compiled = torch.compile(model, options={"coordinate_descent_tuning": True})
with torch.no_grad():
    compiled(torch.randn(4096, 1024, device="cuda"))
torch.cuda.synchronize()
if what == "tune":
    fdh.course.export_tuning(bundle, model="toy", verbose=False)
found = [json.loads(open(p).read()).get("found_by_coordesc")
         for p in __import__("glob").glob(fdh.course.use_course_cache(verbose=False).as_posix()
                                          + "/**/*.best_config", recursive=True)]
print(json.dumps({"coordesc": counters["inductor"]["coordesc_tuning_bench"], "patched": patched,
                  "best_configs": len(found), "found_by_coordesc": sum(bool(f) for f in found),
                  "torch": torch.__version__}))
"""


def child(tmp_path, name, what, bundle, keep):
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / name),
               TORCHINDUCTOR_COMPILE_THREADS="4")
    done = subprocess.run([sys.executable, "-c", CHILD, what, str(bundle), "1" if keep else "0"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_coordinate_descent_does_not_run_again_from_a_bundle(tmp_path):
    bundle = tmp_path / "toy.json.gz"
    first = child(tmp_path, "first", "tune", bundle, keep=True)
    assert first["coordesc"] > 0 and first["found_by_coordesc"] > 0, first
    again = child(tmp_path, "again", "again", bundle, keep=True)
    control = child(tmp_path, "control", "again", bundle, keep=False)
    print(f"coordinate-descent configs timed: first {first['coordesc']}, from the bundle with "
          f"the patch {again['coordesc']} (patch applied: {again['patched']}), without it "
          f"{control['coordesc']} (torch {first['torch']})")
    assert again["coordesc"] == 0, again
