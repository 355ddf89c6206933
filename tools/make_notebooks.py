"""Write the course notebooks 00-08 (clean: no outputs, no execution counts, no widget state).

    .venv/bin/python tools/make_notebooks.py            # rewrite notebooks/00..08
    .venv/bin/python tools/make_notebooks.py 04 07      # only those

The notebooks are the product; this script is a convenience for keeping nine of them
consistent (the same parameters cell, reference-results cell and image grid everywhere).
Edit a notebook here, run the script, and commit both. Cell ids are fixed per position so a
re-run changes only what was edited. 09_playground.ipynb is written by hand and not touched.

House rules the notebooks follow (tests/test_notebooks.py checks the mechanical ones):
every real operation is an fdh call (no def/class in a notebook); GPU-only cells are tagged
"gpu" and start with `if fdh.needs_gpu("why"):`; the parameters cell honours FASTDIFF_SMOKE;
prose quotes no number that was not measured, except published figures with their source
(shared/notes/facts.md: the blog's A100 table, parameter counts, FLOPs).
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"


# --- building blocks ----------------------------------------------------------------------

def md(text: str):
    return ("md", text.strip("\n"))


def code(text: str):
    return ("code", text.strip("\n"))


def gpu(text: str):
    """A GPU-only cell: tagged "gpu"; its code starts with `if fdh.needs_gpu(...)`."""
    text = text.strip("\n")
    assert text.startswith("if fdh.needs_gpu("), text[:60]
    return ("gpu", text)


def params(model: str = "sdxl", extra: str = "") -> tuple:
    return code(f'''
import fastdiff_helpers as fdh
{extra}
# The parameters cell: change the model, steps or resolution here and nowhere else.
# FASTDIFF_SMOKE=1 (CI) gives tiny weights, 2 steps, 64x64 images and the CPU.
settings = fdh.course_settings("{model}")
prompt = "a photo of an astronaut riding a horse on mars"
settings''')


def references() -> list[tuple]:
    """The blog's A100 row for settings.model, and the project's own GPU results if any."""
    return [
        md('''
## Compare with the reference numbers

Published: the PyTorch blog's A100-80GB ladder (`fdh.BLOG_A100_SECONDS`; its "fp32" ran with
TF32 on). Measured by this project: `results/<gpu>/<model>/results.jsonl`, written by
`python -m fastdiff_helpers ladder --out ...` on real GPUs. Compare times only between runs on
the same GPU with the same weights, resolution and steps; the smoke run's tiny CPU numbers are
not comparable with either.'''),
        code('''
print(f"Published ({fdh.BLOG_SOURCE}):")
print("  " + ", ".join(f"{step}: {s} s" for step, s in fdh.BLOG_A100_SECONDS[settings.model].items()))
measured = fdh.reference_results(settings.model)  # {gpu: [Result, ...]}
if not measured:
    print(f"No GPU reference results for {settings.model} are committed yet "
          "(results/<gpu>/<model>/results.jsonl).")
for gpu_name, gpu_results in measured.items():
    print(f"\\nMeasured by this project on {gpu_name}:")
    print(fdh.format_table(gpu_results))'''),
    ]


def images(shown: str, reference: str = "baseline.image") -> tuple:
    """Images side by side, each titled with its PSNR against `reference`."""
    return code(f'''
fdh.show_images({shown}, reference={reference})  # titles carry PSNR against the reference''')


LOAD = "fdh.load_pipeline(settings.model, weights=settings.weights, device=settings.device)"
BENCH = "**settings.bench_kwargs()"
SIZE = "steps=settings.steps, height=settings.height, width=settings.width"


# --- 00 -----------------------------------------------------------------------------------

NB00 = [
    md('''
# 00 · Set-up and environment check

**What you will learn**
- what this machine is: GPU, driver, library versions and the numeric switches that change
  timings (`fdh.env_report()`);
- the four models of the course and their sizes (`fdh.MODELS`);
- which weights you will get: pretrained, random (the full-size architecture) or tiny
  (`weights="auto"` says which, and why);
- smoke mode: how the same notebooks run in CI on a CPU in minutes.

Every notebook of the course starts like this one: `import fastdiff_helpers as fdh`, then a
**parameters cell**. Change the model, steps or resolution there and nowhere else.'''),
    params(),
    md('''
## Smoke mode

`fdh.course_settings()` reads the environment variable `FASTDIFF_SMOKE`. With `FASTDIFF_SMOKE=1`
every notebook uses the **tiny** model (the same diffusers classes with tiny widths and depths,
random weights), 2 denoising steps, 64x64 images and the CPU, and shortens the timing loop.
CI executes every notebook this way, so the code cannot rot; the numbers it prints are CPU
numbers of a toy model and say nothing about a GPU. Without it you get the model's native
resolution, 30 steps and `weights="auto"`.

Cells that need a CUDA GPU are tagged `gpu` and start with `if fdh.needs_gpu("why"):`. On a CPU
they print why they were skipped; they are never deleted.'''),
    code('''
print("smoke mode:", fdh.smoke_mode())
settings.bench_kwargs()  # what every fdh.benchmark call of the course receives'''),
    md('''
## The machine

A timing means nothing without what it ran on: every `fdh.Result` carries this report, and so
should every number you share. Look at `tf32_matmul` and `tf32_cudnn`: torch runs cuDNN
convolutions in TF32 by default, which is why the course's fp32 baseline switches TF32 off
explicitly (notebook 02). `sdpa_*` are the attention backends torch may use (notebook 03).'''),
    code('''
print(fdh.env_report(as_text=True))'''),
    md('''
### The GPU

The compute capability decides what is available: bf16 tensor cores and flash attention need
8.0 (A100) or newer, fp8 tensor cores 8.9 (L4, H100, H200).'''),
    gpu('''
if fdh.needs_gpu("reports the CUDA device"):
    report = fdh.env_report()
    capability = tuple(int(x) for x in report["compute_capability"].split("."))
    print(f"{report['gpu_name']}: compute capability {report['compute_capability']}, "
          f"{report['gpu_memory_bytes'] / 2**30:.0f} GiB, driver {report['driver']}, CUDA {report['cuda']}")
    print("bf16 tensor cores:", capability >= (8, 0), "  fp8 tensor cores:", capability >= (8, 9))'''),
    md('''
## The four models

The course measures one ladder of techniques, from the PyTorch blog "Accelerating Generative AI
Part III: Diffusion, Fast", on four text-to-image models. `fdh.MODELS` holds what the helpers
need for each: hub id, pipeline class, native resolution and steps, and the full-size and tiny
architectures.'''),
    code('''
for key, spec in fdh.MODELS.items():
    print(f"{key:7} {spec.name:38} {spec.pipeline_class:27} denoiser: {spec.denoiser:11} "
          f"{spec.resolution}px, {spec.steps} steps, guidance {spec.guidance}")
    print(f"        {spec.hub_id}" + (f"  ({spec.notes})" if spec.notes else ""))'''),
    md('''
### The one number: parameters

Published parameter counts (`fdh.PUBLISHED_PARAMETERS`, from the model cards and papers): the
SDXL UNet has 2,567,463,684 parameters, the SD 1.5 UNet 859,520,964, the PixArt-alpha
transformer 611,349,152 with a T5-XXL text encoder of 4,762,310,656, and the SD/SDXL VAE
83,653,863. Parameters times bytes per parameter is the memory the weights need, and every
denoising step reads all of the denoiser's weights at least once.

`weights="random"` builds the full-size architecture; on the `meta` device it allocates no
memory, so you can count the parameters of any model on any machine:'''),
    code('''
full = fdh.load_pipeline(settings.model, weights="random", device="meta")
for name, n in fdh.count_parameters(full).items():
    published = fdh.PUBLISHED_PARAMETERS[settings.model].get(name)
    print(f"{name:15} {n:>14,}" + (f"   published: {published:,}" if published else ""))
del full'''),
    md('''
## Which weights will you get?

`weights=` takes `"pretrained"` (the hub id or a local folder; safetensors only), `"random"` (the
full-size architecture with seeded random weights: real speed, memory and FLOPs, meaningless
images), `"tiny"` (small configs, seconds on a CPU) or `"auto"`: pretrained when the weights are
in the local Hugging Face cache or the hub is reachable, else random on a GPU, else tiny.
Here is what `"auto"` would pick for each model on this machine, and why:'''),
    code('''
for key, spec in fdh.MODELS.items():
    weights, why = fdh.choose_weights(spec, None, settings.device)
    print(f"{key:7} -> {weights:10} ({why})")'''),
    md('''
Now load the pipeline of the parameters cell. With `weights="auto"` (the default outside smoke
mode) `load_pipeline` prints its choice; `fdh.pipeline_info` records what was loaded and, later,
which techniques were applied.'''),
    code(f'''
pipe = {LOAD}
fdh.pipeline_info(pipe)'''),
    md('''
## A first image

`fdh.generate` makes one image with the same arguments `fdh.benchmark` uses, from a seeded
generator, so the same call makes the same image. Tiny and random weights draw noise: they are
for timing and testing, not for looking at.'''),
    code(f'''
image = fdh.generate(pipe, prompt, {SIZE})
image'''),
    md('''
## The plain code behind the helper

With pretrained weights, `fdh.load_pipeline("sdxl", weights="pretrained")` is diffusers' own
loader, plus eval mode for every component and a record of what was loaded:

```python
import torch
from diffusers import StableDiffusionXLPipeline

pipe = StableDiffusionXLPipeline.from_pretrained(
    "stabilityai/stable-diffusion-xl-base-1.0", torch_dtype=torch.float32, use_safetensors=True
).to("cuda")
image = pipe("a photo of an astronaut riding a horse on mars", num_inference_steps=30,
             generator=torch.Generator("cpu").manual_seed(0)).images[0]
```

## Try it yourself

```python
import fastdiff_helpers as fdh

print(fdh.env_report(as_text=True))
pipe = fdh.load_pipeline("sd15", weights="auto")      # prints what it chose and why
image = fdh.generate(pipe, "a watercolour fox", steps=20)
fdh.count_parameters(fdh.load_pipeline("pixart", weights="random", device="meta"))
```

To run the notebooks the way CI does: `FASTDIFF_SMOKE=1 jupyter lab notebooks/`.

## Exercises

1. Count the parameters of all four models on the meta device. Which component dominates
   PixArt, and how much memory do its weights need in fp32 and in bf16?
2. Call `fdh.env_report()` before and after `torch.backends.cuda.matmul.fp32_precision = "tf32"`.
   Which keys change?
3. Restart the kernel with `FASTDIFF_SMOKE=1` set and re-run the parameters cell. What changes in
   `settings`?

## Summary

- `fdh.env_report()` records what a measurement ran on; every Result carries it.
- `fdh.MODELS` holds the four models; `weights="random"` on the `meta` device gives their real
  sizes at no cost.
- `weights="auto"` says which weights you got. Compare timings only between runs on the same GPU
  with the same weights.
- Next, **01_baseline**: what one image costs.'''),
]


# --- 01 -----------------------------------------------------------------------------------

NB01 = [
    md('''
# 01 · The fp32 baseline: what one image costs

**What you will learn**
- what a text-to-image call computes, and how many FLOPs that is (`fdh.count_flops`);
- how to time it honestly (`fdh.benchmark`): the cold start apart, warm-up, synchronised timing,
  every sample kept;
- its memory, and the FLOP floor: the time the arithmetic alone needs at the device's matmul rate
  (`fdh.measure_matmul_tflops`, `fdh.flop_floor_seconds`);
- the classic timing mistake, made once on purpose (`fdh.naive_time`).'''),
    params(extra="import torch\n"),
    md('''
## The idea: an image is mostly denoiser passes

One image is: encode the prompt, then `steps` denoiser passes, each on a batch of 2 because of
classifier-free guidance (the prompt and the negative prompt), then one VAE decode. Counted
with `torch.utils.flop_counter` (shared facts): one SDXL UNet forward at 1024x1024 costs
6.761 TFLOP per image, and 30 steps with guidance make 60 of them; the VAE decode costs
10.47 TFLOP once. The denoiser is where the time goes, and every technique of the course
targets it.

`fdh.count_flops` counts from the architecture, on meta-device copies: no weights, no GPU,
seconds. For the full-size model at its native resolution:'''),
    code('''
full_size = fdh.count_flops(settings.model)
print(f"full-size {settings.model} at {full_size['height']}x{full_size['width']}, {full_size['steps']} steps:")
print(f"  denoiser: {full_size['denoiser_per_forward'] / 1e12:.3f} TFLOP per call (batch {full_size['batch']})")
print(f"  VAE decode: {full_size['vae_decode'] / 1e12:.2f} TFLOP, text encoders: {full_size['text_encoders'] / 1e12:.2f} TFLOP")
print(f"  one image: {full_size['per_image'] / 1e12:.0f} TFLOP")'''),
    md('''
## One helper call: the baseline

The course's baseline is **true fp32** (TF32 off) with diffusers' classic attention processor,
`fdh.BASELINE`, the first rung of `fdh.COURSE_LADDER`, the course's own ladder. The blog's ladder,
`fdh.LADDER`, is exactly what diffusion-fast ran, and its "fp32" is not true fp32: every step ran
under `torch.set_float32_matmul_precision("high")`, so its fp32 matmuls used TF32 (`tf32="blog"`).
The two ladders, and what each rung changes from the course's baseline:'''),
    code('''
for title, ladder in [("the blog's ladder (fdh.LADDER)", fdh.LADDER),
                      ("the course's ladder (fdh.COURSE_LADDER)", fdh.COURSE_LADDER)]:
    print(title)
    for name, step_recipe in ladder:
        print(f"  {name:15} {step_recipe.changes(fdh.BASELINE) or 'the baseline'}")'''),
    md('''
Notebook 02 makes TF32 its own step. `fdh.apply` puts a recipe on a freshly loaded pipeline, and
`recipe.to_code()` prints the same surgery as calls to paste into your own notebook.'''),
    code(f'''
recipe = fdh.BASELINE
pipe = fdh.apply({LOAD}, recipe)
print(recipe.to_code())'''),
    md('''
`fdh.benchmark` times the call the honest way: the first call alone (the **cold start**: kernels
chosen, caches filled, later also compilation), untimed warm-up, then `runs` timed calls, each
synchronised with the GPU. It keeps every sample, the median of each stage (text encoding,
denoising, VAE decode), peak memory, the FLOPs and the environment.'''),
    code(f'''
baseline = fdh.benchmark(pipe, prompt, step="fp32", {BENCH})
print(baseline.summary())
print("samples (s):", [round(s, 4) for s in baseline.latency_samples])
print("stages, median (s):", {{stage: round(s, 4) for stage, s in baseline.stages.items()}})'''),
    md('''
## The measurement: FLOPs, seconds, memory

Dividing this pipeline's FLOPs by the measured time gives the rate it achieved. In smoke mode
these are the tiny model's numbers on a CPU, where Python and per-op overhead dominate.'''),
    code('''
flops = fdh.count_flops(pipe, settings.height, settings.width, settings.steps)
print(f"this pipeline: {flops['per_image'] / 1e9:,.2f} GFLOP per image, "
      f"{flops['denoiser_per_forward'] / 1e9:,.3f} GFLOP per denoiser call")
print(f"achieved: {baseline.flops_per_image / baseline.latency_s / 1e12:.4f} TFLOP/s")
print(f"peak memory: {baseline.peak_memory_bytes / 2**30:.2f} GiB ({baseline.peak_memory_kind})")
params = fdh.count_parameters(pipe)
print(f"weights: {params['total']:,} parameters = {params['total'] * 4 / 2**30:.3f} GiB in fp32")
for note in baseline.notes:
    print("note:", note)'''),
    md('''
### The FLOP floor

If every FLOP ran at the device's dense matmul rate, the image would take `FLOPs / rate`
seconds: a lower bound that no technique beats without doing less arithmetic.
`fdh.measure_matmul_tflops` measures the rate with large matmuls. For the fp32 baseline the
relevant rate is fp32's (TF32 off):'''),
    code('''
rate = fdh.measure_matmul_tflops(settings.device, dtype=torch.float32)
floor = fdh.flop_floor_seconds(baseline.flops_per_image, rate)
print(f"{settings.device} fp32 matmul: {rate:.3f} TFLOP/s -> floor {floor:.5f} s per image; "
      f"measured {baseline.latency_s:.4f} s = {baseline.latency_s / floor:.0f}x the floor")'''),
    md('''
The later rungs run in bf16, whose tensor-core rate is far higher. The shared facts give the
floor at a measured dense bf16 rate of about 790 TFLOP/s on an H100/H200, for 30 steps with
guidance: SDXL about 527 ms, SD1.5 about 64 ms, PixArt about 510 ms. The GPU cell computes it for
your GPU and the full-size model, from the architecture:'''),
    gpu('''
if fdh.needs_gpu("measures the GPU's dense bf16 matmul rate"):
    bf16_rate = fdh.measure_matmul_tflops("cuda", dtype=torch.bfloat16)
    full_floor = fdh.flop_floor_seconds(fdh.count_flops(settings.model), bf16_rate)
    print(f"bf16 matmul: {bf16_rate:.0f} TFLOP/s -> floor for full-size {settings.model}: "
          f"{full_floor * 1000:.0f} ms per image")'''),
    md('''
## The mistake, once: timing without synchronising

GPU work is asynchronous: `pipe(...)` returns as soon as its kernels are queued. `fdh.naive_time`
times the call with `time.perf_counter()` and nothing else: no warm-up, no synchronisation, and
latents only (nothing copied back to the host, which would have forced a wait). It is **wrong on
purpose**; never use it for a measurement.'''),
    code(f'''
naive = fdh.naive_time(pipe, prompt, {SIZE})
print(f"naive: {{naive:.4f}} s   fdh.benchmark: {{baseline.latency_s:.4f}} s")'''),
    md('''
On a CPU every op finishes before the next one starts, so the two differ mostly by the VAE
decode the naive call skips and the first call it includes. On a GPU the naive number can be far
too small (only the queueing was timed) or far too large (a cold start, with compilation, counted
as a run); both are wrong. The honest version, which `fdh.benchmark` follows:

```python
torch.cuda.synchronize()           # the queue is empty before the clock starts
start = time.perf_counter()
image = pipe(**kwargs).images[0]
torch.cuda.synchronize()           # every kernel the call queued has finished
seconds = time.perf_counter() - start
```

(Inside the call, `fdh.benchmark` times the stages with CUDA events, which record a timestamp
in the GPU queue without stopping it.)

## Images: the baseline is reproducible

Every call uses a fresh generator with the same seed, so the same call should make the same
image. Later notebooks compare each faster step with the fp32 image using `fdh.compare_images`
(PSNR, SSIM, max abs error, NaN detection); a PSNR of `inf` means identical.'''),
    code(f'''
again = fdh.generate(pipe, prompt, {SIZE})
fdh.compare_images(again, baseline.image)'''),
    images('{"fp32 baseline": baseline.image, "fp32, called again": again}'),
    *references(),
    md('''
## The plain code behind the helper

`fdh.apply(pipe, recipe)` for the baseline, written with diffusers and torch only:'''),
    code('''
print(recipe.to_code("plain"))'''),
    md('''
## Try it yourself

```python
import fastdiff_helpers as fdh

pipe = fdh.apply(fdh.load_pipeline("sdxl", weights="auto"), fdh.Recipe())  # the fp32 baseline
baseline = fdh.benchmark(pipe, "your prompt", steps=30, runs=5, warmup=2, step="fp32")
print(baseline.summary())
fdh.count_flops("sd15", height=768, width=768)        # any model, any resolution
fdh.save_results([baseline], "my_results.jsonl")       # every sample and the environment
```

## Exercises

1. Use `fdh.count_flops("sdxl", height=h, width=h)` for h = 512, 768, 1024. Do the denoiser FLOPs
   grow with the pixel count, or faster? Which part grows faster (hint: attention)?
2. Benchmark with `runs=10` and look at `baseline.latency_samples` and `baseline.latency_iqr_s`.
   How many runs do you need before the median stops moving?
3. What share of the time is the VAE decode (`baseline.stages`), and what share of the FLOPs?
4. On a GPU, call `fdh.naive_time` on a warmed-up pipeline with `output_type="pil"`. Why does the
   number move towards `fdh.benchmark`'s?

## Summary

- One image is `steps` x 2 denoiser passes plus a VAE decode: count them with `fdh.count_flops`.
- Time with `fdh.benchmark`: cold start apart, warm-up, synchronised runs, every sample kept.
- `fdh.flop_floor_seconds` with `fdh.measure_matmul_tflops` gives the time the arithmetic alone
  needs; the distance to it is what the next notebooks remove.
- Never time GPU work without synchronising (`fdh.naive_time` shows why).
- Next, **02_precision**: 16-bit numbers.'''),
]


# --- 02 -----------------------------------------------------------------------------------

NB02 = [
    md('''
# 02 · Precision: bf16, fp16 and TF32

**What you will learn**
- what halving the bytes per number buys: less weight memory, less traffic, faster tensor cores;
- bf16, fp16 and TF32: range against precision;
- speed, memory and image quality of each, against the fp32 baseline (`fdh.compare_images`);
- the fp16 VAE trap: SDXL's VAE overflows in fp16 and decodes to NaN, and how to see it.'''),
    params(),
    md('''
## The idea: two bytes instead of four

fp32 stores 4 bytes per number, bf16 and fp16 store 2. The SDXL UNet has 2,567,463,684
parameters (published); the cell below turns that into memory per format. Every denoising step
reads all of those weights, and a GPU's tensor cores multiply 16-bit matrices many times faster
than fp32 ones. In the blog's A100 table, SDXL went from 7.36 s (fp32, with TF32 on) to 4.63 s
in bf16.

- **bf16**: fp32's 8-bit exponent (the same range, up to about 3.4e38) with a 7-bit mantissa:
  it does not overflow where fp32 does not, but it is coarse.
- **fp16**: a 5-bit exponent (the largest finite value is 65504) and a 10-bit mantissa: finer,
  but an activation beyond 65504 becomes `inf`, and `inf - inf` is `NaN`.
- **TF32**: not a storage format. fp32 numbers whose matmuls and convolutions run on tensor cores
  with a 10-bit mantissa; a process-wide switch, no memory saved. The two sources turn it on
  differently: the blog's code called `torch.set_float32_matmul_precision("high")` before every
  step (`Recipe(tf32="blog")`), the diffusers guide shows
  `torch.backends.cuda.matmul.allow_tf32 = True` (`Recipe(tf32="guide")`); both leave cuDNN's
  convolutions at torch's default, which is TF32. The course's own `dtype="tf32"` (`tf32="on"`)
  also sets the CUDA-wide level that inductor's compiled convolutions read. Every result records
  the TF32 state it ran with (`result.tf32`).'''),
    code('''
unet_parameters = fdh.PUBLISHED_PARAMETERS["sdxl"]["unet"]
for dtype, nbytes in {"fp32 / tf32": 4, "bf16": 2, "fp16": 2}.items():
    print(f"SDXL UNet weights in {dtype:11}: {unet_parameters * nbytes / 2**30:5.2f} GiB")'''),
    md('''
## The previous step: the fp32 baseline

The baseline of notebook 01, measured again in this process (timings are only comparable within
one machine and one run of the notebook).'''),
    code(f'''
pipe = fdh.apply({LOAD}, fdh.Recipe(dtype="fp32"))
baseline = fdh.benchmark(pipe, prompt, step="fp32", {BENCH})
del pipe
print(baseline.summary())'''),
    md('''
## One helper call: bf16

`fdh.Recipe(dtype="bf16")` casts every component to bf16 (`fdh.set_precision` underneath). The
`baseline=` argument makes `fdh.benchmark` compare the image with the fp32 one.'''),
    code(f'''
recipe = fdh.Recipe(dtype="bf16")
pipe = fdh.apply({LOAD}, recipe)
result = fdh.benchmark(pipe, prompt, step="bf16", baseline=baseline, {BENCH})
del pipe
print(result.summary())
print(f"speed-up vs fp32: {{baseline.latency_s / result.latency_s:.2f}}x")
result.quality'''),
    md('''
## TF32 and fp16

The same measurement for the other two. On a CPU, TF32 changes nothing (it is a CUDA switch) and
16-bit math is often *slower* (no tensor cores): the speed-ups are a GPU story, while the quality
comparison means something on any device.'''),
    code(f'''
results = [baseline, result]
for dtype in ["tf32", "fp16"]:
    pipe = fdh.apply({LOAD}, fdh.Recipe(dtype=dtype))
    results.append(fdh.benchmark(pipe, prompt, step=dtype, baseline=baseline, {BENCH}))
    del pipe
    print(results[-1].summary())'''),
    md('''
## Speed, memory and quality side by side

`fdh.format_table` prints the steps with their speed-up against the first, peak memory and PSNR
against the fp32 image. On a GPU, peak memory is the CUDA allocator's maximum during the timed
calls; on a CPU it is the process's lifetime peak RSS, which only ever grows, so it cannot
compare steps.'''),
    code('''
print(fdh.format_table(results))
fdh.ladder_chart(results)'''),
    code('''
fdh.memory_chart(results)'''),
    md('''
Speed against quality: higher is closer to fp32, further right is faster. bf16 keeps fewer
mantissa bits than fp16, so expect its image to differ more from fp32's; neither difference is
visible at the PSNRs typical of a healthy step (above ~40 dB).'''),
    code('''
fdh.quality_chart(results)'''),
    images('{f"{r.step}, {r.latency_s:.3g} s": r.image for r in results}'),
    md('''
## The fp16 VAE trap

SDXL's VAE produces activations beyond fp16's largest value (65504) while decoding: in fp16 they
become `inf`, then `NaN`, and the image comes out black. diffusers knows: the SDXL VAE's config
sets `force_upcast=True`, and the SDXL pipeline then decodes in fp32 even in an fp16 pipeline
(slower, and the VAE's fp32 weights in memory). The ways out:

- keep the VAE in bf16, which has fp32's range (the course's bf16 step does this);
- use the fp16-fix VAE, `madebyollin/sdxl-vae-fp16-fix`: SDXL's VAE fine-tuned so its
  activations stay within fp16's range, so it can decode in fp16 without upcasting.

The blog used the fp16-fix VAE throughout: diffusion-fast loads it for every step of SDXL and
SSD-1B, the fp32 step included, so the blog's ladder does too (`fdh.BLOG_LOADING`; load it
yourself with `fdh.load_pipeline("sdxl", vae="fp16-fix")`, which takes its weights when
pretrained and its config with random or tiny weights). Every result records the VAE it ran with
(`result.vae`).

Which of the course's VAEs ask for the upcast:'''),
    code('''
for key, spec in fdh.MODELS.items():
    print(f"{key:7} VAE force_upcast={spec.full['vae'].config['force_upcast']}")'''),
    md('''
A NaN image must not pass as "slightly different". `fdh.compare_images` reports `nan: True`
(and warns, naming the usual cause) when either image holds NaN or inf. Check float output
(`output_type="np"`): once converted to a PIL image, NaN has already become 0, a black image
that looks finite. Here an all-NaN float image stands in for a broken decode:'''),
    code('''
import numpy as np

broken = np.full((settings.height, settings.width, 3), np.nan, dtype=np.float32)
fdh.compare_images(broken, baseline.image)'''),
    md('''
On a GPU, the real thing: the fp16 pipeline with diffusers' protection switched off. The
overflow is a property of the *trained* VAE weights, so expect NaN with pretrained SDXL weights,
and possibly none with random or tiny ones.'''),
    gpu(f'''
if fdh.needs_gpu("decodes with the SDXL VAE in fp16 on the GPU"):
    pipe = fdh.apply(fdh.load_pipeline(settings.model, weights=settings.weights, device="cuda"),
                     fdh.Recipe(dtype="fp16"))
    print("weights:", fdh.pipeline_info(pipe)["weights"])
    pipe.vae.register_to_config(force_upcast=False)  # switch diffusers' upcast off
    kwargs = fdh.call_kwargs(pipe, prompt, {SIZE})
    unsafe = pipe(**{{**kwargs, "output_type": "np"}}).images[0]
    print("fp16 VAE, no upcast:", fdh.compare_images(unsafe, baseline.image))
    del pipe'''),
    md('''
The fix with the fp16-fix VAE, on a machine that can download it, in plain diffusers:

```python
import torch
from diffusers import AutoencoderKL

pipe.vae = AutoencoderKL.from_pretrained("madebyollin/sdxl-vae-fp16-fix",
                                         torch_dtype=torch.float16).to("cuda")
```

or with the helpers, `fdh.load_pipeline("sdxl", weights="pretrained", vae="fp16-fix")`.

## The plain code behind the helper'''),
    code('''
print(recipe.to_code("plain"))'''),
    *references(),
    md('''
## Try it yourself

```python
pipe = fdh.apply(fdh.load_pipeline("sdxl", weights="auto"), fdh.Recipe(dtype="bf16"))
result = fdh.benchmark(pipe, "your prompt", baseline=baseline, step="bf16")
fdh.compare_images(result.image, baseline.image)
fdh.load_pipeline("sdxl", weights="auto", dtype="bf16")   # or load in bf16 directly
```

## Exercises

1. Which image is closer to fp32, bf16's or fp16's? Explain it with the mantissa widths.
2. On a GPU, time TF32 against fp32 and against bf16. What does TF32 give for free, and what
   does it not give (memory)?
3. Keep the UNet in bf16 and put only the VAE back to fp32 (`pipe.vae.to(torch.float32)` after
   `fdh.apply`). What does the VAE decode stage (`result.stages`) cost?
4. With pretrained SDXL weights on a GPU, run the fp16 pipeline with `force_upcast` on and off and
   compare `result.stages["vae_decode"]` and the images.

## Summary

- bf16 halves the weights and runs on tensor cores; its range is fp32's, so it is the safe
  16-bit format. fp16 is finer but overflows past 65504.
- TF32 is a switch for fp32 matmuls, not a storage type: speed without memory savings.
- Always look at quality next to speed: `fdh.compare_images` flags NaN images.
- SDXL's VAE needs fp32 (`force_upcast`) or bf16 or the fp16-fix VAE.
- Next, **03_attention**.'''),
]


# --- 03 -----------------------------------------------------------------------------------

NB03 = [
    md('''
# 03 · Attention: classic vs scaled-dot-product attention

**What you will learn**
- why the classic attention processor is slow: it writes the whole score matrix to memory;
- torch's `scaled_dot_product_attention` (SDPA) and its backends: flash, memory-efficient, math
  and cuDNN;
- which backends run on this GPU, and what each costs against the previous step.'''),
    params(),
    md('''
## The idea: do not write the score matrix

For N tokens, attention computes `softmax(Q K^T / sqrt(d)) V`. diffusers' classic processor
(`AttnProcessor`) does it in separate ops: it writes an N x N score matrix per head to memory,
reads it for the softmax, writes the probabilities, reads them again for the product with V.
Fused kernels (flash attention and its relatives) compute the same result tile by tile in
on-chip memory and never write the matrix. In the blog's A100 table, SDXL went from 4.63 s
(bf16) to 3.31 s with SDPA.

The one number: the size of one score matrix in SDXL's largest attention layers, at 1024x1024
(computed from the architecture):'''),
    code('''
spec = fdh.MODELS["sdxl"]
tokens = (spec.resolution // 8 // 2) ** 2                      # 128x128 latent, downsampled once
heads = spec.full["unet"].config["attention_head_dim"][1]       # diffusers' SDXL config stores head counts here
batch, nbytes = 2, 2                                            # classifier-free guidance; bf16
scores = batch * heads * tokens * tokens * nbytes
print(f"{tokens} tokens, {heads} heads: one bf16 score matrix = {scores / 2**30:.2f} GiB "
      "per attention layer, written and read several times by the classic processor")'''),
    md('''
## The previous step: bf16 with the classic processor'''),
    code(f'''
pipe = fdh.apply({LOAD}, fdh.Recipe(dtype="bf16"))
previous = fdh.benchmark(pipe, prompt, step="bf16", {BENCH})
del pipe
print(previous.summary())'''),
    md('''
## One helper call: SDPA

`attention="sdpa"` installs diffusers' `AttnProcessor2_0`, which calls
`torch.nn.functional.scaled_dot_product_attention` and lets torch pick the kernel for the
device, dtype and shapes. (diffusers 0.42's `set_attention_backend` does nothing on
`UNet2DConditionModel` and `PixArtTransformer2DModel`, so the helper sets the processors.)'''),
    code(f'''
recipe = fdh.Recipe(dtype="bf16", attention="sdpa")
pipe = fdh.apply({LOAD}, recipe)
result = fdh.benchmark(pipe, prompt, step="+ SDPA", baseline=previous, {BENCH})
del pipe
print(result.summary())
print(f"speed-up vs classic: {{previous.latency_s / result.latency_s:.2f}}x   quality vs classic: {{result.quality}}")'''),
    md('''
## The backends

SDPA has several implementations; `attention="sdpa-<backend>"` forces one with
`torch.nn.attention.sdpa_kernel`:

- **flash** (FlashAttention-2): tiles in on-chip memory, fp16/bf16 only, CUDA;
- **efficient** (memory-efficient attention, from xFormers): also tiled, more dtypes and shapes, CUDA;
- **cuDNN**: NVIDIA's fused attention, recent GPUs, CUDA;
- **math**: the reference implementation in plain torch ops, the same work as the classic
  processor; runs everywhere.

The math backend runs on any device:'''),
    code(f'''
pipe = fdh.apply({LOAD}, fdh.Recipe(dtype="bf16", attention="sdpa-math"))
math_result = fdh.benchmark(pipe, prompt, step="sdpa-math", baseline=previous, {BENCH})
del pipe
results = [previous, result, math_result]
print(fdh.format_table(results))'''),
    md('''
On a GPU, every backend in turn. Each kernel has limits (torch's `cuda/sdp_utils.cpp`, written
down in `fdh.techniques.attention.SDPA_LIMITS`): flash takes head dims up to 256, cuDNN up to
128, both only in fp16/bf16, and flash takes no attention mask. Every VAE attention has one head
512 wide, so the helper pins a backend only on the attentions it can run and leaves the rest on
default SDPA; a recipe no attention could run (flash or cuDNN in fp32, flash on PixArt's masked
cross-attention) is refused before any work. A backend that still cannot run on this GPU raises
instead of falling back (that is what forcing a backend means); the cell reports it and goes
on.'''),
    gpu(f'''
if fdh.needs_gpu("flash, memory-efficient and cuDNN attention are CUDA kernels"):
    print("enabled in torch:", {{k: v for k, v in fdh.env_report().items() if k.startswith("sdpa_")}})
    backends = []
    for attention in ["sdpa", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "sdpa-math"]:
        try:
            pipe = fdh.apply(fdh.load_pipeline(settings.model, weights=settings.weights, device="cuda"),
                             fdh.Recipe(dtype="bf16", attention=attention))
            backends.append(fdh.benchmark(pipe, prompt, step=attention, baseline=previous, {BENCH}))
            print(backends[-1].summary())
        except (RuntimeError, fdh.RecipeError) as err:  # refused, or "No available kernel"
            print(f"{{attention}}: cannot run here: {{str(err).splitlines()[0]}}")
        pipe = None
    print(fdh.format_table(backends))'''),
    md('''
## Speed, memory and images'''),
    code('''
fdh.ladder_chart(results)'''),
    images('{f"{r.step}, {r.latency_s:.3g} s": r.image for r in results}', "previous.image"),
    md('''
## The plain code behind the helper

SDPA is one call; forcing a backend wraps every call in a context manager, which is why the
helper has a small processor for it (`fdh.techniques.attention.SDPABackendProcessor`):

```python
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

out = F.scaled_dot_product_attention(q, k, v)            # torch picks the kernel
with sdpa_kernel(SDPBackend.FLASH_ATTENTION):            # or force one
    out = F.scaled_dot_product_attention(q, k, v)
```

The whole recipe as plain diffusers and torch code:'''),
    code('''
print(fdh.Recipe(dtype="bf16", attention="sdpa-flash").to_code("plain"))'''),
    *references(),
    md('''
## Try it yourself

```python
pipe = fdh.apply(fdh.load_pipeline("sdxl", weights="auto"), fdh.Recipe(dtype="bf16", attention="sdpa"))
fdh.benchmark(pipe, "your prompt", step="+ SDPA")
fdh.set_attention(pipe, "sdpa-flash")      # on a pipeline you build step by step
```

## Exercises

1. Compute the score-matrix size for SD1.5 at 512x512 and PixArt at 1024x1024 from their
   configs in `fdh.MODELS[...].full` (SD1.5's first attention level sees the latent itself;
   PixArt's patch size 2 halves each side of the latent).
2. On a GPU, compare the peak memory of `bf16` (classic) and `+ SDPA` with `fdh.memory_chart`.
   Does the difference match the score-matrix size?
3. Profile one call with `torch.profiler` and find the attention kernels' names: which backend
   did plain `"sdpa"` pick?

## Summary

- The classic processor writes the N x N score matrix; SDPA's fused backends never do.
- `attention="sdpa"` lets torch choose; `"sdpa-flash"`, `"-efficient"`, `"-cudnn"`, `"-math"`
  force a backend, and a forced backend fails loudly where it cannot run.
- The math backend is the reference: same work as the classic processor.
- Next, **04_torch_compile**.'''),
]


# --- 04 -----------------------------------------------------------------------------------

NB04 = [
    md('''
# 04 · torch.compile

**What you will learn**
- what compiling buys: fused kernels, fewer launches, tuned matmuls and convolutions
  (`mode="max-autotune"`) and CUDA graphs;
- the blog's inductor flags and `channels_last`;
- graph breaks and `fullgraph=True`, and why pipelines call the UNet with `return_dict=False`;
- the cold start against the warm run, and the compile cache that shortens the next cold start;
- regional compile; dynamic shapes and recompilation.'''),
    params(extra="import dataclasses\nimport torch\n"),
    md('''
## The idea: one graph instead of hundreds of separate ops

In eager mode every op is launched from Python on its own, and every elementwise op reads and
writes its whole tensor. `torch.compile` captures the forward pass as a graph (dynamo), then
generates fused kernels for it (inductor). `mode="max-autotune"` also benchmarks candidate
matmul and convolution kernels and captures CUDA graphs: the whole denoiser call replays as one
launch. In the blog's A100 table, compile took SDXL from 3.31 s to 2.54 s and SD1.5 from
1.178 s to 0.500 s.

The one number: how many ops dynamo captures in one denoiser call, each a separate launch from
Python in eager mode. `fdh.graph_breaks` traces the denoiser with the inputs the pipeline really
passes and reports dynamo's graphs, breaks and ops. It uses dynamo's `ExplainWithBackend` rather
than `torch._dynamo.explain`, because `explain` calls `torch._dynamo.reset()`, which throws away
every compiled model in the process.'''),
    code(f'''
previous_recipe = fdh.LADDER[2][1]  # "+ SDPA": bf16, SDPA, eager
pipe = fdh.apply({LOAD}, previous_recipe)
breaks = fdh.graph_breaks(pipe, height=settings.height, width=settings.width)'''),
    md('''
### Graph breaks and `fullgraph=True`

Where dynamo cannot trace (a data-dependent Python branch, an unsupported call), it **breaks**
the graph: the code before and after becomes two graphs with Python in between. Zero breaks
means `fullgraph=True` works, and the ladder uses it: with `fullgraph=True` a break is an error
instead of a silent slowdown.

diffusers' pipelines call the denoiser with `return_dict=False`, so it returns a plain tuple of
tensors rather than its output dataclass: the simplest output for a compiled graph to produce.
(Whether your torch version also traces the dataclass without a break is exercise 2.)

Before compiling, the eager step to compare with:'''),
    code(f'''
previous = fdh.benchmark(pipe, prompt, step="+ SDPA", {BENCH})
del pipe
print(previous.summary())'''),
    md('''
## The inductor flags and channels_last

The blog set four inductor options (process-wide, in `torch._inductor.config`), all in
`fdh.techniques.compile.INDUCTOR_FLAGS`:

- `conv_1x1_as_mm`: run 1x1 convolutions as matmuls;
- `coordinate_descent_tuning` and `coordinate_descent_check_all_directions`: tune each generated
  kernel's block sizes by coordinate descent (a longer compile for faster kernels);
- `epilogue_fusion=False`: do not fuse pointwise ops into matmul epilogues (the blog's choice).

`channels_last` stores the UNet's and VAE's activations as NHWC, the layout GPU convolution
kernels prefer.'''),
    code('''
fdh.techniques.compile.INDUCTOR_FLAGS'''),
    md('''
## One helper call: compile

The ladder's `+ compile` step: `mode="max-autotune"`, `fullgraph=True`, the inductor flags and
`channels_last`, on the denoiser and the VAE decode. `max-autotune` captures CUDA graphs, so on a
CPU `Recipe.for_device` runs `mode="default"` instead and says so. Compiling on a CPU takes a
minute or more per graph, so smoke mode compiles the denoiser only.'''),
    code('''
recipe, notes = fdh.LADDER[3][1].for_device(settings.device)
if settings.smoke:
    recipe = dataclasses.replace(recipe, compile_vae=False)  # one graph, not two, on a CPU
print("changes vs + SDPA:", recipe.changes(previous_recipe))
print("\\n".join(notes))
print(recipe.to_code())'''),
    md('''
Compilation happens at the first call. `fdh.benchmark` times that call alone as the **cold
start** and reports the steady state after warm-up as `latency_s`. In smoke mode read only the
cold start: warm CPU timings of a toy model say nothing about the speed-up on a GPU.'''),
    code(f'''
pipe = fdh.apply({LOAD}, recipe)
result = fdh.benchmark(pipe, prompt, step="+ compile", baseline=previous, {BENCH})
print(result.summary())
print(f"cold start {{result.cold_start_s:.1f}} s (compiling) against {{result.latency_s:.4f}} s warm; "
      f"speed-up vs eager: {{previous.latency_s / result.latency_s:.2f}}x")'''),
    md('''
## The compile cache

Compiled code lives in memory (dynamo's cache, per function, with guards that check the inputs
still match) and on disk: inductor's FX graph cache, on by default, stores generated kernels
under `TORCHINDUCTOR_CACHE_DIR` (default: a folder in `/tmp`). Point that variable at a
persistent folder to keep compiled kernels across restarts, or ship it to other machines with
the same GPU and versions.

`torch._dynamo.reset()` forgets the in-memory code. A fresh pipeline with the same recipe is then
traced again, but inductor finds the graph in its cache. (If you ran this notebook before on this
machine, the first cold start above may already have come from the cache.)'''),
    code(f'''
from torch._inductor.runtime.cache_dir_utils import cache_dir

print("FX graph cache on:", torch._inductor.config.fx_graph_cache, "  folder:", cache_dir())
del pipe
torch._dynamo.reset()
pipe = fdh.apply({LOAD}, recipe)
cached = fdh.benchmark(pipe, prompt, step="+ compile, cached", baseline=previous, {BENCH})
print(f"cold start: first {{result.cold_start_s:.1f}} s, again from the cache {{cached.cold_start_s:.1f}} s")'''),
    md('''
## Dynamic shapes and recompilation

A compiled graph is specialised to the shapes it saw, and guarded: a call with another
resolution fails the guard and triggers a **recompile** (a second cold start). With
`dynamic=None` (the default) torch recompiles once with the changed sizes as symbols ("automatic
dynamic shapes") so later sizes reuse that graph; `dynamic=False` compiles one static graph per
shape, and `dynamic=True` starts symbolic (more general, usually slower kernels). After
`torch._dynamo.config.recompile_limit` recompiles of one function, torch gives up and runs it
eagerly.

To catch recompiles you did not expect, make them errors: `torch._dynamo.config.error_on_recompile`.
Here a 1.5x larger image trips it, and the message names the failing guard.'''),
    code('''
torch._dynamo.config.error_on_recompile = True
try:
    fdh.benchmark(pipe, prompt, steps=settings.steps, height=settings.height * 3 // 2,
                  width=settings.width * 3 // 2, runs=1, warmup=0)
except torch._dynamo.exc.RecompileError as err:
    print(f"RecompileError: {err}")
finally:
    torch._dynamo.config.error_on_recompile = False'''),
    md('''
Without the error, the new size recompiles; its cold start is the price of the new shape.
Skipped in smoke mode, where a second compile takes minutes on a CPU.'''),
    code('''
if settings.smoke:
    print("Skipped in smoke mode: a recompile takes minutes on a CPU.")
else:
    resized = fdh.benchmark(pipe, prompt, steps=settings.steps, height=settings.height * 3 // 2,
                            width=settings.width * 3 // 2, runs=2, warmup=1, step="+ compile, 1.5x size")
    print(f"new size: cold start {resized.cold_start_s:.1f} s (a recompile), then {resized.latency_s:.3f} s")'''),
    md('''
## Regional compile

Instead of the whole denoiser, regional compile compiles its repeated blocks: blocks of the same
class and shapes can share compiled code, which is meant to shorten the cold start at some cost in
speed. Three ways, as the diffusers guide shows them and one of the course's own:

- `compile_scope="regional"`: diffusers' `compile_repeated_blocks()`, which compiles the blocks
  the model class declares in `_repeated_blocks`. diffusers 0.42 declares `BasicTransformerBlock`
  for the UNet (its ResNet blocks stay eager) and nothing for PixArt, so the helper refuses it
  there and says what to use instead.
- `compile_scope="regional-extended"`: the course's own, those blocks plus the ones diffusers leaves
  eager (the UNet's `ResnetBlock2D`; PixArt's `BasicTransformerBlock`).
- `compile_scope="regional-accelerate"`: accelerate's `compile_regions`, which compiles each
  `ModuleList` of same-class blocks and the rest of the model separately. It fails on diffusers'
  UNets (a wrapped `GroupNorm` that the UNet's forward tests for truth), so the helper refuses it
  there before any work.

Regional compile runs without CUDA graphs: each block would replay its own graph, and a replay
overwrites the output the next block is about to read (pytorch/pytorch#152887), so
`Recipe.for_device` turns `max-autotune` into `max-autotune-no-cudagraphs` here and says so.
Whether any of them shortens the cold start on your machine is what the cell measures: compare
the cold-start column. Skipped in smoke mode: many small graphs take minutes to compile on a CPU.'''),
    code(f'''
results = [previous, result]
if settings.smoke:
    print("Skipped in smoke mode: regional compile builds many small graphs, minutes on a CPU.")
else:
    del pipe
    scopes = ["regional", "regional-extended"] + (["regional-accelerate"] if settings.model == "pixart" else [])
    for scope in scopes:
        torch._dynamo.reset()
        regional, notes = dataclasses.replace(recipe, compile_scope=scope).for_device(settings.device)
        print("\\n".join(notes))
        pipe = fdh.apply({LOAD}, regional)
        results.append(fdh.benchmark(pipe, prompt, step=f"+ compile, {{scope}}", baseline=previous, {BENCH}))
        del pipe
print(fdh.format_table(results))'''),
    md('''
### The modes, on a GPU

`"default"` generates fused kernels; `"max-autotune-no-cudagraphs"` also benchmarks candidate
matmul and convolution kernels at compile time; `"max-autotune"` adds CUDA graphs. Each costs
more cold start; the cell measures what each gives warm (minutes: three compiles).'''),
    gpu(f'''
if fdh.needs_gpu("max-autotune tunes GPU kernels and captures CUDA graphs"):
    modes = []
    for mode in ["default", "max-autotune-no-cudagraphs", "max-autotune"]:
        torch._dynamo.reset()
        gpu_pipe = fdh.apply(fdh.load_pipeline(settings.model, weights=settings.weights, device="cuda"),
                             dataclasses.replace(fdh.LADDER[3][1], compile=mode))
        modes.append(fdh.benchmark(gpu_pipe, prompt, step=mode, baseline=previous, {BENCH}))
        print(modes[-1].summary())
        del gpu_pipe
        fdh.free_memory()
    print(fdh.format_table(modes))'''),
    md('''
## Speed and images

Compiled kernels fuse and reorder floating-point operations, so the image may differ slightly
from eager's: the PSNR says by how much.'''),
    code('''
fdh.ladder_chart(results)'''),
    images('{f"{r.step}, {r.latency_s:.3g} s": r.image for r in results}', "previous.image"),
    md('''
## The plain code behind the helper'''),
    code('''
print(recipe.to_code("plain"))'''),
    *references(),
    md('''
## Try it yourself

```python
pipe = fdh.apply(fdh.load_pipeline("sdxl", weights="auto"), fdh.LADDER[2][1])  # eager bf16 + SDPA
fdh.graph_breaks(pipe)                           # 0 breaks -> fullgraph=True will work
pipe = fdh.apply(fdh.load_pipeline("sdxl", weights="auto"), fdh.LADDER[3][1])  # + compile
result = fdh.benchmark(pipe, "your prompt", step="+ compile")
print(result.cold_start_s, result.latency_s)
```

Keep compiled kernels between sessions: `export TORCHINDUCTOR_CACHE_DIR=$HOME/.cache/inductor`.

## Exercises

1. Compile with `compile_vae=False` (`dataclasses.replace(recipe, compile_vae=False)`): how much
   of the speed-up came from the VAE decode? Compare `result.stages`.
2. Capture the denoiser's inputs with `args, kw = fdh.capture_denoiser_inputs(pipe)` on an
   uncompiled pipeline and run `torch._dynamo.explain(fdh.get_denoiser(pipe).forward)(*args,
   **{**kw, "return_dict": True})` inside `torch.inference_mode()`. Does your torch break the
   graph on the output dataclass? (`explain` resets dynamo: compiled pipelines recompile after.)
3. Compile with `dynamic=False`, then call two resolutions. How many cold starts do you pay, and
   what does `torch._dynamo.config.recompile_limit` protect against?
4. Run the notebook twice with `TORCHINDUCTOR_CACHE_DIR` set to an empty folder. How much of the
   cold start does the cache save?

## Summary

- `torch.compile` fuses ops and, with `max-autotune`, tunes kernels and replays CUDA graphs.
- Check `fdh.graph_breaks` first; zero breaks lets `fullgraph=True` guard against slow paths.
- Report the cold start apart from the warm time; the FX graph cache shortens the next cold
  start; regional compile is meant to shorten it too: measure it on your machine.
- A new shape is a recompile: catch the unexpected ones with `error_on_recompile`.
- Next, **05_fused_qkv**.'''),
]


# --- 05 -----------------------------------------------------------------------------------

NB05 = [
    md('''
# 05 · Fused QKV projections

**What you will learn**
- what fusing the Q, K and V projections changes: one wider matmul instead of three;
- how many projection matmuls that removes from a denoiser call;
- what it gives on its own, and why it matters more under int8 quantization.'''),
    params(extra="import torch\nfrom diffusers.models.attention_processor import Attention\n"),
    md('''
## The idea: read the input once

Every attention layer projects its input three times, to queries, keys and values: three
matmuls that read the same input. diffusers' `fuse_qkv_projections()` concatenates the three
weight matrices into one (`to_qkv`), so a single matmul three times as wide reads the input once
and produces all three; cross-attention fuses K and V (`to_kv`), which both read the text
embedding. Fewer launches, one read of the input, and a larger matmul that fills the GPU better.
diffusers keeps the unfused projections beside the fused ones (SDXL's UNet would grow from
2.57 B to 3.22 B parameters); `fdh.fuse_qkv` deletes them, so the weights stay the same size.
The blog does not credit fusion alone with a number: its 2.54 s -> 2.52 s for SDXL on an A100
is the gain of its "additional optimizations" together (no graph breaks, no GPU syncs in the
loop, and combined projections). Its stated reason to fuse is the next step: fusion "increases
the size of the matmuls of the input projections and improves the impact of quantization".

The one number: projection matmuls per denoiser call, counted on the full-size architecture (on
the meta device, no memory):'''),
    code('''
full = fdh.load_pipeline(settings.model, weights="random", device="meta")
layers = [m for m in fdh.get_denoiser(full).modules() if isinstance(m, Attention)]
print(f"full-size {settings.model}: {len(layers)} attention layers -> {3 * len(layers)} Q/K/V projection matmuls")
params_before = sum(p.numel() for p in fdh.get_denoiser(full).parameters())
fdh.fuse_qkv(fdh.set_attention(full, "sdpa"))
params_after = sum(p.numel() for p in fdh.get_denoiser(full).parameters())
print(f"parameters: {params_before:,} unfused, {params_after:,} fused (the unfused copies are deleted)")
fused = sum(1 if getattr(m, "to_qkv", None) is not None else 2 if getattr(m, "to_kv", None) is not None
            else 3 for m in layers)  # self-attention: to_qkv; cross-attention: to_q + to_kv
print(f"fused: {fused} projection matmuls per denoiser call")
del full, layers'''),
    md('''
## The previous step: bf16 + SDPA (eager)

Fusion works with or without compile. Eager here, so that it runs on any machine; the compiled
comparison, the ladder's, is in the GPU cell below.'''),
    code(f'''
previous_recipe = fdh.Recipe(dtype="bf16", attention="sdpa")
pipe = fdh.apply({LOAD}, previous_recipe)
previous = fdh.benchmark(pipe, prompt, step="+ SDPA", {BENCH})
del pipe
print(previous.summary())'''),
    md('''
## One helper call: fuse_qkv'''),
    code(f'''
recipe = fdh.Recipe(dtype="bf16", attention="sdpa", fuse_qkv=True)
pipe = fdh.apply({LOAD}, recipe)
result = fdh.benchmark(pipe, prompt, step="+ fused QKV", baseline=previous, {BENCH})
print(result.summary())
print(f"speed-up vs unfused: {{previous.latency_s / result.latency_s:.2f}}x")
print("attention processors now:", sorted({{type(p).__name__ for p in fdh.get_denoiser(pipe).attn_processors.values()}}))
del pipe'''),
    md('''
The same arithmetic in a different grouping: expect an image identical or nearly so (a wider
matmul may sum in another order).'''),
    images('{f"{r.step}, {r.latency_s:.3g} s": r.image for r in [previous, result]}', "previous.image"),
    md('''
## Why it matters more under quantization

Dynamic int8 quantization (notebook 07) quantizes each linear layer's *input* on every call: it
finds the input's scale (a reduction over the activation), rounds it to int8, runs an int8
matmul and rescales the output. Unfused, Q, K and V each quantize the same input: three
reductions, three roundings, three small int8 matmuls. Fused, the input is quantized once and
one int8 matmul three times as wide runs: fewer, larger int8 matmuls, which is where int8 pays.

On a GPU, the ladder's compiled steps, and int8 with and without fusion (each step compiles with
`max-autotune`: minutes per step):'''),
    gpu(f'''
if fdh.needs_gpu("compiles with max-autotune and quantizes with int8 on the GPU"):
    import dataclasses

    int8_unfused = dataclasses.replace(fdh.LADDER[5][1], fuse_qkv=False)
    steps = [("+ compile", fdh.LADDER[3][1]), ("+ fused QKV", fdh.LADDER[4][1]),
             ("+ int8, unfused", int8_unfused), ("+ int8 dynamic", fdh.LADDER[5][1])]
    compiled = []
    for name, step_recipe in steps:
        pipe = fdh.apply(fdh.load_pipeline(settings.model, weights=settings.weights, device="cuda"),
                         step_recipe)
        compiled.append(fdh.benchmark(pipe, prompt, step=name, baseline=previous, {BENCH}))
        print(compiled[-1].summary())
        del pipe
        fdh.free_memory()
    print(fdh.format_table(compiled))'''),
    md('''
## The plain code behind the helper'''),
    code('''
print(recipe.to_code("plain"))'''),
    *references(),
    md('''
## Try it yourself

```python
pipe = fdh.load_pipeline("sdxl", weights="auto", dtype="bf16")
fdh.set_attention(pipe, "sdpa")
fdh.fuse_qkv(pipe)                     # diffusers' fuse_qkv_projections() on the UNet and VAE
fdh.apply(fdh.load_pipeline("sdxl"), fdh.LADDER[4][1])   # the ladder's "+ fused QKV" step
```

## Exercises

1. Count the projection matmuls for every model of `fdh.MODELS`. Which has the most attention
   layers per denoiser call?
2. `fdh.fuse_qkv` refuses the classic attention processor. Read the error: why does fusing need
   SDPA?
3. On a GPU, compare "+ int8, unfused" and "+ int8 dynamic" with the fused and unfused bf16
   steps. Is fusion worth more with int8?

## Summary

- Fusing Q, K and V turns three matmuls into one wider matmul that reads the input once.
- On its own it gives little; under dynamic int8 it also saves two of three activation
  quantizations per attention layer.
- Next, **06_gpu_syncs**.'''),
]


# --- 06 -----------------------------------------------------------------------------------

NB06 = [
    md('''
# 06 · GPU syncs

**What you will learn**
- what a device-to-host synchronisation is, and why one inside the denoising loop costs more than
  its own time;
- how to find them: CUDA's sync debug mode (`fdh.count_syncs`) and a profiler trace;
- how to remove them (`fdh.remove_syncs`, `Recipe(no_sync=True)`), and when it matters.'''),
    params(extra="import dataclasses\nimport torch\n"),
    md('''
## The idea: the CPU must run ahead

The CPU queues kernels for the GPU and normally runs ahead of it, so the GPU never waits for
Python. Any call that needs a value *from* the GPU (`.item()`, `.nonzero()`, `bool(tensor)`,
printing a tensor, a blocking copy to the GPU) makes the CPU wait until the queue has drained: a
**sync**. After it the GPU sits idle while Python prepares the next kernels.

The blog's example was the scheduler's sigmas: diffusers kept them on the GPU, and every step
looked up its index with `(timesteps == t).nonzero().item()` and read a sigma back. diffusers has
since fixed that at the source: Euler and DPM-Solver keep their sigmas on the CPU
(`self.sigmas.to("cpu")` in `set_timesteps`), and the pipelines call
`scheduler.set_begin_index(0)`, so no index lookup is left. What remains in diffusers 0.42 is
schedulers without that care: PNDM (SD1.5's default) indexes its CPU table of alphas with the GPU
timestep and compares it on the host, every step.

The one number: syncs per denoising step, counted by `fdh.count_syncs` with CUDA's sync debug
mode (GPU only; on a CPU there is no queue to drain).'''),
    code(f'''
previous_recipe = fdh.Recipe(dtype="bf16", attention="sdpa")
pipe = fdh.apply({LOAD}, previous_recipe)
previous = fdh.benchmark(pipe, prompt, step="+ SDPA", {BENCH})
print(previous.summary())'''),
    gpu(f'''
if fdh.needs_gpu("counts synchronising CUDA calls with torch.cuda.set_sync_debug_mode"):
    before = fdh.count_syncs(pipe, prompt=prompt, {SIZE})'''),
    md('''
### A profiler trace

The same, seen in time: `torch.profiler` records CPU ops and GPU kernels. Sync points show as
`cudaStreamSynchronize` / `cudaMemcpy` calls and as `aten::item` / `aten::_local_scalar_dense`
ops; in the trace (open it in https://ui.perfetto.dev) the GPU row has a gap after each.'''),
    gpu(f'''
if fdh.needs_gpu("profiles CUDA kernels and synchronisations"):
    from pathlib import Path
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fdh.generate(pipe, prompt, {SIZE})
    for event in prof.key_averages():
        if any(word in event.key for word in ("Synchronize", "Memcpy", "aten::item", "_local_scalar_dense", "aten::nonzero")):
            print(f"{{event.key:40}} x{{event.count}}")
    Path("../out").mkdir(exist_ok=True)
    prof.export_chrome_trace("../out/06_gpu_syncs_trace.json")
    print("trace written to out/06_gpu_syncs_trace.json")'''),
    md('''
## One helper call: remove the syncs

`Recipe(no_sync=True)` (`fdh.remove_syncs` underneath) decides from the pipeline and its scheduler
what is left to do, and records why (`fdh.pipeline_info(pipe)["applied"]["no_sync"]`, and the
result's notes):
- PNDM (SD1.5): the schedule moves to the CPU, so stepping never reads a GPU tensor, and each CPU
  timestep is copied to the GPU with `non_blocking=True`;
- Euler (SDXL, SSD-1B) and DPM-Solver: nothing, diffusers already does it;
- PixArt: nothing either, on purpose: its pipeline copies a CPU timestep to the GPU with a
  blocking `.to()` before the transformer sees it, so a CPU schedule would add a sync per step.

The math is unchanged, so the image must be identical.'''),
    code(f'''
del pipe
recipe = dataclasses.replace(previous_recipe, no_sync=True)
pipe = fdh.apply({LOAD}, recipe)
result = fdh.benchmark(pipe, prompt, step="+ no syncs", baseline=previous, {BENCH})
print(result.summary())
print("no_sync:", fdh.pipeline_info(pipe)["applied"]["no_sync"]["why"])
print(f"speed-up: {{previous.latency_s / result.latency_s:.2f}}x   image identical: {{result.quality['psnr'] == float('inf')}}")'''),
    gpu(f'''
if fdh.needs_gpu("counts synchronising CUDA calls after remove_syncs"):
    after = fdh.count_syncs(pipe, prompt=prompt, {SIZE})'''),
    images('{f"{r.step}, {r.latency_s:.3g} s": r.image for r in [previous, result]}', "previous.image"),
    md('''
## When it matters

In eager mode the GPU's queue is short anyway: Python launches each op just before the GPU
needs it, so a sync costs little more than itself. Once the denoiser is compiled into a few
large kernels, or replayed as one CUDA graph, the CPU could queue many steps ahead, and a sync
per step throws that away. On a GPU, the compiled step with and without syncs:'''),
    gpu(f'''
if fdh.needs_gpu("compiles with max-autotune on the GPU"):
    compiled = []
    for name, step_recipe in [("+ compile", fdh.LADDER[3][1]),
                              ("+ compile, no syncs", dataclasses.replace(fdh.LADDER[3][1], no_sync=True))]:
        gpu_pipe = fdh.apply(fdh.load_pipeline(settings.model, weights=settings.weights, device="cuda"),
                             step_recipe)
        compiled.append(fdh.benchmark(gpu_pipe, prompt, step=name, baseline=previous, {BENCH}))
        del gpu_pipe
        fdh.free_memory()
    print(fdh.format_table(compiled))'''),
    md('''
## The plain code behind the helper

There is no library switch for this; the helper's decision and its two functions are printed in
full:'''),
    code('''
print(recipe.to_code("plain"))'''),
    *references(),
    md('''
## Try it yourself

```python
fdh.count_syncs(pipe)                  # on a GPU: total, inside the loop, per step, and where
fdh.remove_syncs(pipe)                 # or Recipe(..., no_sync=True)
fdh.count_syncs(pipe)
torch.cuda.set_sync_debug_mode("warn") # the switch behind count_syncs, for your own code
```

## Exercises

1. With `torch.cuda.set_sync_debug_mode("error")`, run one image. Which line raises first?
2. Which scheduler of the four models syncs most per step? (`pipe.scheduler` differs: Euler for
   SDXL and SSD-1B, PNDM for SD1.5, DPM-Solver for PixArt.) Swap SD1.5's for
   `DPMSolverMultistepScheduler.from_config(pipe.scheduler.config)`, as the blog did, and count
   again.
3. Print a tensor inside a `callback_on_step_end` and count the syncs again.

## Summary

- A sync makes the CPU wait for the GPU's queue to drain; inside the loop it stalls every step.
- Find them with `fdh.count_syncs` (CUDA sync debug mode) and a profiler trace.
- diffusers now keeps Euler's and DPM-Solver's sigmas on the CPU; PNDM (SD1.5) still syncs
  every step. `fdh.remove_syncs` / `Recipe(no_sync=True)` fixes what is left and says when there
  is nothing to do: same math, same image.
- They matter most once the denoiser is compiled.
- Next, **07_int8_quantization**.'''),
]


# --- 07 -----------------------------------------------------------------------------------

NB07 = [
    md('''
# 07 · Dynamic int8 quantization with torchao

**What you will learn**
- what dynamic int8 quantization does, and where it pays;
- choosing the layers: the blog's filter function (`fdh.techniques.blog_filter`, diffusion-fast's
  own, exactly) and the course's (`fdh.techniques.fastdiff_filter`), through `quant_filter=`;
- turning 1x1 convolutions into linears so quantization reaches them;
- why it needs `torch.compile`, and where it does not pay at all.'''),
    params(extra="import dataclasses\nimport torch\n"),
    md('''
## The idea: int8 matmuls, quantized on the fly

torchao's `Int8DynamicActivationInt8WeightConfig` stores each selected linear's weights in int8
with a scale, and on every call quantizes the *input* too (dynamic: the scale is computed from
the activation each time), runs an int8 matmul and rescales the result. GPUs' int8 tensor
cores have a higher peak rate than their bf16 ones, and int8 weights are half the bytes. But the quantization of
the activation is extra work: it pays only for large matmuls that see many tokens, and only when
`torch.compile` fuses the quantization into the surrounding kernels. Measured by the
diffusers-torchao project on an H100 with FLUX.1-dev: 6.57 s in bf16, but 130 s with int8
dynamic quantization *without* compile.

The last rung of the ladder paid on the big models (SDXL 2.52 s -> 2.43 s in the blog's A100
numbers) but not on SD1.5, whose matmuls are small at 512x512: 0.494 s -> 0.525 s, slower. The
blog says why it may not be the last word: "Note that for Stable Diffusion v1-5 and PixArt-Alpha,
we didn't explore the best shape combination criteria for applying dynamic int8 quantization. It
might be possible to get better numbers with a better combination." Its SD1.5, SSD-1B and
PixArt figures are published only as charts (`fdh.BLOG_A100_WHERE` says where each row was read):'''),
    code('''
for model, row in fdh.BLOG_A100_SECONDS.items():
    print(f"{model:7} + fused QKV {row['+ fused QKV']:.3f} s -> + int8 dynamic {row['+ int8 dynamic']:.3f} s "
          f"({row['+ fused QKV'] / row['+ int8 dynamic']:.2f}x)")
    print(f"        read from: {fdh.BLOG_A100_WHERE[model]}")'''),
    md('''
## The filter function

`quant_filter` decides which linears are quantized:

- `"blog"`: diffusion-fast's `dynamic_quant_filter_fn`, exactly (`fdh.techniques.blog_filter`):
  every `nn.Linear` with more than 16 input features, except 19 `(in_features, out_features)`
  shapes its authors found not to gain, measured on SDXL ("Through experimentation, we found that
  certain linear layers in the UNet and the VAE don't benefit", the blog says). The list is a
  list of shapes, not of layers: the same list is applied to SD1.5 and PixArt, whose shapes differ.
- `"fastdiff"`: the course's own heuristic, not the blog's (`fdh.techniques.fastdiff_filter`): only
  linears of a million weights or more that see many tokens; not the timestep and size
  embeddings, which see one token, nor cross-attention's K and V, which see only the 77 or 120
  text tokens. Unmeasured on a GPU so far: compare it with the blog's on yours.
- `"all"` (every `nn.Linear`) or your own function `(module, fqn) -> bool`.

Whatever the filter, int8 dynamic leaves out a linear whose in or out features are not a multiple
of 8 (`fdh.techniques.quantization.int8_kernel_ok`): torchao's int8 matmul falls back to a CPU
matmul for those, a device-to-host sync on every call.

The one number: how many of the full-size denoiser's linears each filter selects (counted on the
meta device):'''),
    code('''
from fastdiff_helpers.techniques.quantization import select_filter

full = fdh.load_pipeline(settings.model, weights="random", device="meta")
named = list(fdh.get_denoiser(full).named_modules())
linears = sum(isinstance(m, torch.nn.Linear) for _, m in named)
counts = {name: sum(select_filter("int8-dynamic", name)(m, n) for n, m in named)
          for name in ("blog", "fastdiff", "all")}
print(f"full-size {settings.model}: {linears} linears; int8 dynamic selects {counts}")'''),
    md('''
### 1x1 convolutions as linears

A 1x1 convolution is a matmul over channels, but `quantize_` only replaces `nn.Linear` layers.
The blog "turn[s] suitable pointwise convolution layers into linear layers": with torchao's
`swap_conv2d_1x1_to_linear` and its `conv_filter_fn`, the 1x1 convs with 128 channels in or out,
in every compiled step (not only the int8 one), on the UNet and the VAE. `fdh.conv1x1_to_linear(pipe,
"blog")` does the same (`Recipe(conv1x1_to_linear="blog")`, part of `fdh.LADDER`'s compile step);
`"all"` is the course's own option, every pointwise conv:'''),
    code('''
for which in ("blog", "all"):
    full = fdh.load_pipeline(settings.model, weights="random", device="meta")
    fdh.conv1x1_to_linear(full, which)
    named = list(fdh.get_denoiser(full).named_modules())
    swapped = fdh.pipeline_info(full)["applied"]["conv1x1_to_linear"]["swapped"]
    print(f"{which!r}: swapped {swapped} 1x1 convolutions (denoiser and VAE); the blog's filter now "
          f"selects {sum(fdh.techniques.blog_filter(m, n) for n, m in named)} denoiser linears")
del full, named'''),
    md('''
## The previous step: bf16 + SDPA + fused QKV (eager)'''),
    code(f'''
previous_recipe = fdh.Recipe(dtype="bf16", attention="sdpa", fuse_qkv=True)
pipe = fdh.apply({LOAD}, previous_recipe)
previous = fdh.benchmark(pipe, prompt, step="+ fused QKV", {BENCH})
weights = fdh.pipeline_info(pipe)["weights"]
del pipe
print(previous.summary())'''),
    md('''
## One helper call: quantize, without compile

Eager first, to see the warning and its cost, with the blog's filter. (On the tiny model it
selects most linears: its shapes are not among the 19 the blog excluded.)'''),
    code(f'''
quant_filter = "blog"
recipe = dataclasses.replace(previous_recipe, quantize="int8-dynamic", quant_filter=quant_filter)
pipe = fdh.apply({LOAD}, recipe)  # warns: quantization without compile
result = fdh.benchmark(pipe, prompt, step="+ int8, eager", baseline=previous, {BENCH})
print(fdh.pipeline_info(pipe)["applied"]["quantize"])
del pipe
print(result.summary())
print(f"speed-up vs bf16: {{previous.latency_s / result.latency_s:.2f}}x")'''),
    md('''
Quantization changes the numbers: the PSNR against the bf16 image says by how much.'''),
    images('{f"{r.step}, {r.latency_s:.3g} s": r.image for r in [previous, result]}', "previous.image"),
    md('''
## With compile: the ladder's last two steps

The ladder's int8 step compiles with `max-autotune`, the inductor flags and the one the blog
added for int8 that torch still reads, `force_fuse_int_mm_with_mul` (the blog also set
`use_mixed_mm`, which torch 2.13 ignores: its config calls it deprecated, so the course does not
set it). torchao's configs would set inductor flags of their own, process-wide; the helpers pass
`set_inductor_config=False`, so the recipe's flags are the only ones.
On a GPU, `fdh.run_ladder` runs the two steps on fresh pipelines (minutes each: compile):'''),
    gpu('''
if fdh.needs_gpu("compiles with max-autotune and runs int8 matmuls on the GPU"):
    last_two = fdh.run_ladder(settings.model, weights=settings.weights, steps=settings.steps,
                              height=settings.height, width=settings.width, runs=settings.runs,
                              warmup=settings.warmup, device="cuda",
                              steps_filter=["+ fused QKV", "+ int8 dynamic"])
    display(fdh.ladder_chart(last_two))'''),
    md('''
## The plain code behind the helper

The ladder's int8 step as torchao, diffusers and torch code (the filter function is printed in
full):'''),
    code('''
print(fdh.LADDER[5][1].to_code("plain"))'''),
    *references(),
    md('''
## Try it yourself

```python
pipe = fdh.apply(fdh.load_pipeline("sdxl", weights="auto"), fdh.LADDER[5][1])  # the blog's int8 step
fdh.benchmark(pipe, "your prompt", step="+ int8 dynamic")

# one technique at a time, with your own filter (only attention projections)
pipe = fdh.apply(fdh.load_pipeline("sdxl", weights="auto"), fdh.Recipe(dtype="bf16", attention="sdpa"))
only_attention = lambda module, fqn: isinstance(module, torch.nn.Linear) and ".attn" in fqn
fdh.quantize(pipe, "int8-dynamic", quant_filter=only_attention)
fdh.compile_pipeline(pipe, mode="max-autotune")
```

## Exercises

1. On a GPU, quantize with `quant_filter="all"`, then `"fastdiff"`, instead of `"blog"`. Which
   linears make it slower, and why?
2. Use `conv1x1_to_linear="all"` in the int8 recipe instead of the blog's `"blog"`. Does
   quantizing every 1x1 convolution pay?
3. Try `quantize="int8-weight-only"`: weights in int8, activations in bf16. When would that win
   (hint: batch size 1, memory-bound matmuls)?
4. Why does int8 dynamic not pay on SD1.5 at 512x512? Count its tokens per attention layer.

## Summary

- Dynamic int8 quantizes weights once and activations on every call; it pays on large matmuls
  with many tokens, and only with `torch.compile`.
- Choose the layers with a filter (the blog's is a list of shapes measured on SDXL); swap 1x1
  convolutions for linears to let it reach them.
- It can make a model slower (SD1.5 in the blog's numbers): measure it, with its quality cost.
- Next, **08_all_models**.'''),
]


# --- 08 -----------------------------------------------------------------------------------

NB08 = [
    md('''
# 08 · The same ladder on all four models

**What you will learn**
- how the ladder's steps transfer from SDXL to SD1.5, SSD-1B and PixArt (`fdh.run_ladder`);
- what differs per model (`fdh.MODELS[m].notes`);
- one chart comparing the models (`fdh.models_chart`).

`fdh.run_ladder` runs every step of `fdh.LADDER` on a **fresh** pipeline (a pipeline takes one
recipe), records a failing step instead of stopping, compares each image with the first step's,
and with `out=` writes results, images and charts as it goes (here under `out/08_all_models/`,
which git ignores).

`fdh.LADDER` is the blog's ladder, exactly as diffusion-fast ran it, and `run_ladder` loads each
model as diffusion-fast did (`fdh.BLOG_LOADING`): SDXL and SSD-1B with the fp16-fix VAE, SD1.5
with `DPMSolverMultistepScheduler` ("As the default scheduler of SD v1-5 doesn't have sigmas
device placement", its code says), PixArt as it comes. Every result records its VAE, scheduler
and TF32 state. The course's own ladder, `fdh.COURSE_LADDER`, runs beside it at the end.'''),
    params(extra="from pathlib import Path\n"),
    md('''
In smoke mode the compile steps (`+ compile`, `+ fused QKV`, `+ int8 dynamic`, which compiles
too) are **skipped**: compiling four models takes far longer than a CI run may. On a GPU the
whole ladder runs: expect several minutes per compiled step.'''),
    code('''
models = ["sdxl", "sd15", "ssd1b", "pixart"]
steps_filter = ["fp32", "bf16", "+ SDPA"] if settings.smoke else None
print("steps:", steps_filter or [name for name, _ in fdh.LADDER])
out = Path("../out/08_all_models")
results_by_model = {}'''),
    md('''
## SDXL

The course's reference model. Each model uses its own settings (native resolution and steps, or
smoke mode's tiny ones) from `fdh.course_settings(model)`.'''),
    code('''
model = "sdxl"
print(fdh.MODELS[model].name, "-", fdh.MODELS[model].notes or "the reference model")
s = fdh.course_settings(model)
results_by_model[model] = fdh.run_ladder(model, steps_filter=steps_filter, out=out / model,
                                         **s.ladder_kwargs())'''),
    md('''
## SD 1.5

Smaller (a UNet of 859,520,964 parameters against SDXL's 2,567,463,684) and at 512x512: its
matmuls are small, so fixed overheads weigh more. In the blog's A100 table compile gave it the
largest step of the four models (1.178 s -> 0.500 s) and int8 made it slower (0.494 s -> 0.525 s).'''),
    code('''
model = "sd15"
print(fdh.MODELS[model].name, "-", fdh.MODELS[model].notes)
s = fdh.course_settings(model)
results_by_model[model] = fdh.run_ladder(model, steps_filter=steps_filter, out=out / model,
                                         **s.ladder_kwargs())'''),
    md('''
## SSD-1B

Segmind's distilled SDXL: the same text encoders and VAE, a UNet of about 1.3 billion parameters
(SSD-1B paper, arXiv 2401.02677) with some residual and transformer blocks removed.'''),
    code('''
model = "ssd1b"
print(fdh.MODELS[model].name, "-", fdh.MODELS[model].notes)
s = fdh.course_settings(model)
results_by_model[model] = fdh.run_ladder(model, steps_filter=steps_filter, out=out / model,
                                         **s.ladder_kwargs())'''),
    md('''
## PixArt-alpha

A transformer denoiser (611,349,152 parameters) instead of a UNet, attending over 4096 tokens
at 1024x1024: its only convolutions are the patch embedding and the VAE's, so `channels_last`
and `conv_1x1_as_mm` have little to work on. Its T5-XXL text encoder (4,762,310,656 parameters)
runs once per image but dominates memory. In the blog's A100 table SDPA gave it the largest
step of the four models (5.604 s -> 3.085 s).'''),
    code('''
model = "pixart"
print(fdh.MODELS[model].name, "-", fdh.MODELS[model].notes)
s = fdh.course_settings(model)
results_by_model[model] = fdh.run_ladder(model, steps_filter=steps_filter, out=out / model,
                                         **s.ladder_kwargs())'''),
    md('''
## One chart: the speed-up of each step, per model

Each bar is a step's speed-up over that model's own fp32 step, so models of different sizes
share one axis.'''),
    code('''
fdh.models_chart(results_by_model)'''),
    md('''
Quality: PSNR of each step's image against the model's fp32 image (`inf`: identical).'''),
    code('''
for model, results in results_by_model.items():
    print(model.ljust(7), "  ".join(f"{r.step}: {r.quality['psnr']:.1f} dB" if r.ok else f"{r.step}: failed"
                                    for r in results))'''),
    md('''
## The course's own ladder beside the blog's

`run_ladder(..., ladder="course")` runs `fdh.COURSE_LADDER`: a true fp32 baseline with TF32 as a
step of its own, the pipeline's own VAE and scheduler, no 1x1-conv swap, sync removal as a step,
and the course's own int8 filter. Its step names say what each changes, so the two ladders are
never mixed up in a table.'''),
    code('''
course_steps = ["fp32, TF32 off", "+ TF32", "bf16"] if settings.smoke else None
s = fdh.course_settings("sdxl")
course = fdh.run_ladder("sdxl", ladder="course", steps_filter=course_steps,
                        out=out / "sdxl-course", **s.ladder_kwargs())
for r in course:
    print(f"{r.step:16} vae={r.vae}, scheduler={r.scheduler}, TF32 matmul={r.tf32.get('matmul')}")'''),
    md('''
## Against the blog's A100 numbers

The same chart per model with the blog's A100 timings beside ours: meaningful only for real
weights at native resolution on a GPU (`run_ladder` draws it into `out/08_all_models/<model>/ladder.png`
for non-tiny weights). The tables below print the blog's row for every model, and the project's
own GPU results where they are committed.'''),
    code('''
print(f"Published ({fdh.BLOG_SOURCE}):")
for model in models:
    print(f"  {model:7}", ", ".join(f"{step}: {s} s" for step, s in fdh.BLOG_A100_SECONDS[model].items()))
    print(f"          read from: {fdh.BLOG_A100_WHERE[model]}")
measured = {model: fdh.reference_results(model) for model in models}
if not any(measured.values()):
    print("No GPU reference results are committed yet (results/<gpu>/<model>/results.jsonl).")
for model, by_gpu in measured.items():
    for gpu_name, gpu_results in by_gpu.items():
        print(f"\\nMeasured by this project: {model} on {gpu_name}")
        print(fdh.format_table(gpu_results))'''),
    md('''
## The plain code behind the helper

Every model gets the same recipe; the helpers absorb the per-model differences (the UNet or the
transformer, the blocks regional compile needs, the layers the filter skips). The last step as
plain code:'''),
    code('''
print(fdh.LADDER[-1][1].to_code("plain"))'''),
    md('''
## Try it yourself

```python
results = fdh.run_ladder("pixart", weights="auto", out="out/pixart")     # the whole ladder
fdh.run_ladder("sd15", steps_filter=["+ compile", "+ int8 dynamic"])      # some steps only
print(fdh.format_table(results))
```

From a shell: `python -m fastdiff_helpers ladder --model sd15 --weights auto --out out/sd15`.

## Exercises

1. Which model gains most from compile, and which from SDPA? Relate it to their resolution and
   denoiser type.
2. For PixArt, compare `+ compile` with `compile_scope="regional"`: what does the cold start cost?
3. Load `results.jsonl` from a run with `fdh.load_results` and draw `fdh.quality_chart` per model.

## Summary

- The ladder transfers, but not equally: in the blog's numbers the small, low-resolution SD1.5
  gained most from compile and lost with int8, and the transformer PixArt gained most from SDPA.
- `fdh.run_ladder` isolates failures, keeps every result, and draws the charts.
- Next, **09_playground**: try your own recipes.'''),
]


NOTEBOOKS_SPEC = {
    "00_setup": NB00, "01_baseline": NB01, "02_precision": NB02, "03_attention": NB03,
    "04_torch_compile": NB04, "05_fused_qkv": NB05, "06_gpu_syncs": NB06,
    "07_int8_quantization": NB07, "08_all_models": NB08,
}


def build(name: str, cells: list[tuple]) -> nbformat.NotebookNode:
    nb = new_notebook()
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python",
                       "name": "python3"},
        "language_info": {"name": "python"},
    }
    for i, (kind, text) in enumerate(cells):
        cell_id = f"nb{name[:2]}-{i:02d}"
        if kind == "md":
            cell = new_markdown_cell(text, id=cell_id)
        else:
            cell = new_code_cell(text, id=cell_id)
            if kind == "gpu":
                cell.metadata["tags"] = ["gpu"]
        nb.cells.append(cell)
    nbformat.validate(nb)
    return nb


def main(argv: list[str]) -> None:
    wanted = [n for n in NOTEBOOKS_SPEC if not argv or any(n.startswith(a) for a in argv)]
    for name in wanted:
        path = NOTEBOOKS / f"{name}.ipynb"
        nbformat.write(build(name, NOTEBOOKS_SPEC[name]), path)
        print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main(sys.argv[1:])
