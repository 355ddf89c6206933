"""Tuning seeded across GPU kinds of one design: what one kind tuned, imported on another whose
SM count and compute capability are the same, said and recorded, never silent.

Introduced in 06_cold_start.ipynb. Why it can hold: inductor's kernels and their keys depend on
the device only through its DeviceProperties (torch/_inductor/runtime/hints.py: type, index, SM
count, compute capability, registers and threads per SM, threads per block, warp size), which an
H100 SXM and an H200 share (both a GH100 with 132 SMs, compute capability 9.0); the GPU's name
enters only the timings file's name, inductor's system hash (codecache.py CacheBase.get_system:
the name, triton's key and the CUDA version). The timings are another card's: an H200's memory
is faster, so a shape's winner may differ by a little; that is why the import is explicit and
every result measured with it says where its tuning came from.
"""

from __future__ import annotations

from typing import Any

__all__ = ["KNOWN_KINDS", "cross_kind_problems", "raw_kind_problems"]

# (SM count, compute capability) of the kinds the course has met, for a raw tarball (which
# carries the GPU's name, not its properties). NVIDIA's H100 Tensor Core GPU Architecture
# whitepaper: H100 SXM5 132 SMs, H100 PCIe 114; the H200 is the same GH100 configuration as
# the H100 SXM5; all compute capability 9.0.
KNOWN_KINDS: dict[str, tuple[int, tuple[int, int]]] = {
    "NVIDIA H100 80GB HBM3": (132, (9, 0)),
    "NVIDIA H200": (132, (9, 0)),
    "NVIDIA H100 PCIe": (114, (9, 0)),
}
# the stamp's fields that may differ between two kinds of one design (MUST_MATCH's others may
# not): the name, and the timings file's name derived from it
ACROSS_KINDS = ("gpu_name", "system_hash")


def cross_kind_problems(stamp: dict, here: dict, must_match: tuple[str, ...]) -> list[str]:
    """Why a bundle stamped `stamp` may not seed this machine (`here`), one phrase each; empty
    when it may: another GPU name, the same SM count and compute capability, everything else
    of the stamp equal."""
    problems = []
    if stamp.get("gpu_name") is None or here.get("gpu_name") is None:
        problems.append("a seed goes from one GPU to another (this stamp has none)")
    elif stamp.get("gpu_name") == here.get("gpu_name"):
        problems.append(f"the bundle is of this kind ({here['gpu_name']}): import it without "
                        "from_kind")
    for key in ("sm_count", "capability"):
        if stamp.get(key) is None or stamp.get(key) != here.get(key):
            problems.append(f"{key}: bundle {stamp.get(key)!r}, here {here.get(key)!r}")
    problems += [f"{key}: bundle {stamp.get(key)!r}, here {here.get(key)!r}"
                 for key in must_match if key not in ACROSS_KINDS + ("sm_count", "capability")
                 and stamp.get(key) != here.get(key)]
    return problems


def raw_kind_problems(system: Any, here_system: dict, from_kind: str, sm_count: int | None,
                      capability: list[int] | None) -> list[str]:
    """Why a raw timings file (its inductor "system" record) of GPU kind `from_kind` may not
    seed this machine (its system record, SM count and capability); empty when it may."""
    if not isinstance(system, dict):
        return ["the timings file has no system record"]
    name = (system.get("device") or {}).get("name")
    problems = []
    if name != from_kind:
        problems.append(f"its GPU is {name!r}, not {from_kind!r}")
    if from_kind not in KNOWN_KINDS:
        problems.append(f"{from_kind!r} is not a kind whose SM count the course knows "
                        f"({', '.join(KNOWN_KINDS)})")
    elif KNOWN_KINDS[from_kind] != (sm_count, tuple(capability or ())):
        sms, cc = KNOWN_KINDS[from_kind]
        problems.append(f"{from_kind} has {sms} SMs and compute capability {cc}, this GPU "
                        f"{sm_count} and {tuple(capability or ())}")
    if system.get("version") != here_system.get("version"):
        problems.append("its triton or CUDA is not this machine's")
    return problems
