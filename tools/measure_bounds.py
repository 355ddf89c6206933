"""Measure the image differences that bound tests/test_techniques.py (issue 13).

    OMP_NUM_THREADS=1 python tools/measure_bounds.py

For each tiny model, 2 steps, CPU: max abs difference and PSNR of the float image against the
true fp32 baseline, for the same-math techniques (their noise), bf16 and bf16 + int8 on every
linear (their cost), and another seed (a different image). Re-run it when a technique changes
and keep each test bound well clear of the neighbouring range."""

import warnings

import numpy as np
import torch

import fastdiff_helpers as fdh

RECIPES = {
    "sdpa": fdh.Recipe(attention="sdpa"),
    "sdpa-math": fdh.Recipe(attention="sdpa-math"),
    "fused QKV": fdh.Recipe(attention="sdpa", fuse_qkv=True),
    "channels_last": fdh.Recipe(channels_last=True),
    "no_sync": fdh.Recipe(no_sync=True),
    "conv1x1_to_linear": fdh.Recipe(conv1x1_to_linear=True),
    "bf16": fdh.Recipe(dtype="bf16", attention="sdpa"),
    "int8 (all)": fdh.Recipe(dtype="bf16", attention="sdpa", quantize="int8-dynamic",
                             quant_filter="all"),
}


def image(pipe, seed=0):
    kwargs = fdh.call_kwargs(pipe, steps=2, seed=seed)
    kwargs["output_type"] = "np"
    with torch.inference_mode():
        return pipe(**kwargs).images[0].astype(np.float64)


def psnr(a, b):
    mse = np.mean((a - b) ** 2)
    return float("inf") if mse == 0 else 10 * np.log10(1 / mse)


def main():
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    for model in [m for m, spec in fdh.MODELS.items() if "blog" in spec.ladders]:  # fp32 baseline
        def fresh():
            return fdh.load_pipeline(model, weights="tiny", device="cpu", verbose=False)

        base = image(fdh.apply(fresh(), fdh.Recipe()))
        out = {name: image(fdh.apply(fresh(), recipe)) for name, recipe in RECIPES.items()}
        out["seed 1"] = image(fdh.apply(fresh(), fdh.Recipe()), seed=1)
        for name, im in out.items():
            print(f"{model:7} {name:18} max abs {np.abs(im - base).max():.3g}  "
                  f"PSNR {psnr(im, base):.1f} dB")
        print(f"{model:7} {'int8 vs bf16':18} max abs "
              f"{np.abs(out['int8 (all)'] - out['bf16']).max():.3g}")


if __name__ == "__main__":
    main()
