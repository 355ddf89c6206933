"""Published and measured figures the planning estimates rest on, as data: each with its
source, the figure as the source writes it, and the settings it was measured with.

Documented in docs/workshop.md ("The course clock"); image_time.py turns these into
fdh.course.image_seconds, the plan's and the clock's image times. At the end, the ladders as
their sources published them (the blog's A100 rows, diffusers-torchao's Flux H100 figures),
which the reference numbers quote (fdh.course.BLOG_A100_SECONDS and the like). Pure data:
imports nothing.
tests/test_image_time.py checks each estimate against the figures here;
tests/test_memory_model.py the peaks.

Roles: "anchor", an estimate rests on it (equal to it once converted to the course's steps);
"ratio", an estimate rests on it through the same source's figure on another card (the card's
estimate is the other card's times the source's ratio of the two); "check", an independent
figure the estimate must stay within 1.3x of; "context", listed with why it is not used. Paths: "tf32" (fp32 weights, TF32 matmuls and convolutions), "half" (bf16
or fp16, classic attention), "sdpa" (half precision with scaled_dot_product_attention, eager),
"compiled" (torch.compile of the denoiser, VAE too where said). A "compiled" figure is used as
its gain over the same source's "sdpa" figure for that card and model.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Published:
    card: str  # the GPU profile key it stands for (planning/gpus.py), or a card in OTHER_CARDS
    device: str  # the device as the source names it
    model: str
    path: str
    figure: float
    unit: str  # "s" (one image, batch 1, at `steps`) or "it/s" (denoising steps a second)
    steps: int  # the run's steps (0: not stated; an it/s figure does not need them)
    source: str  # a key of SOURCES
    quote: str  # the figure as the source writes it
    settings: str
    role: str = "anchor"
    note: str = ""


# Cards that are no workshop profile but carry published figures (for the nearest-card rule):
# NVIDIA's V100 SXM2 datasheet, 125 TFLOPS tensor (fp16), 15.7 TFLOPS FP32; compute capability 7.0.
OTHER_CARDS = {"v100": {"name": "Tesla V100", "tflops": 125.0, "fp32_tflops": 15.7,
                        "capability": (7, 0)}}

_CSV = ("diffusion-fast's collated CSVs (huggingface.co/datasets/sayakpaul/sample-datasets: "
            "{}): 'time (secs)', the mean of torch.utils.benchmark's blocked_autorange after 3 "
            "warm-ups (run_benchmark.py); 'memory (gbs)', torch.cuda.max_memory_allocated() / "
            "1024**3 (utils/benchmarking_utils.py)")
_SDXL_CSV = _CSV.format("blob/8285f7668326f13af8d213cd8087218cd7f97483/"
                            "collated_results_sdxl.csv")
_SD15_CSV = _CSV.format("blob/cd3714455caf789c3d9268486ac3a9cb3c04e021/"
                            "collated_results_sdv15.csv")
_PIXART_CSV = _CSV.format("blob/cd3714455caf789c3d9268486ac3a9cb3c04e021/"
                              "collated_results_pixart.csv")
_SSD1B_CSV = _CSV.format("commit/fa3951592c72eee8b1dd127337edfeeb2be789f6, SSD-1B's rows "
                             "of collated_results_sdxl.csv before that commit")
_BLOG = ("A100-80GB, batch 1, 30 steps, native size; torch 2.3.0.dev20231218, diffusers 0.25; "
         "its fp32 row with TF32 matmuls (set_float32_matmul_precision('high')); "
         "compile: max-autotune, fullgraph, UNet and VAE, its inductor flags")
_OURS_FILE = ("results/h100-80gb-hbm3/sdxl/results.jsonl (latency_s, the median of 5 timed runs; "
         "results/README.md's table)")
_OURS_SET = ("H100 80GB HBM3, random weights, 1024x1024, 30 steps, batch 1, the blog's ladder "
             "(TF32 'blog'); torch 2.11.0+cu130, diffusers 0.42.1")
_COURSE_FILE = ("results/h100-80gb-hbm3/sdxl-course/results.jsonl (latency_s, the median of 5 "
                "timed runs for fp32, of 20 for the others; slot-2026-11-27.md)")
_COURSE_SET = ("H100 80GB HBM3, random weights, 1024x1024, 30 steps, batch 1, the course's "
               "ladder: fp32 with TF32 off, TF32 on for matmuls and convolutions, bf16 with "
               "the classic attention processor, then SDPA; torch 2.11.0+cu130, diffusers 0.42.1")
_TORCH2_DOC = ("diffusers docs, 'Torch 2.0' (docs/source/en/optimization/torch2.0.md; "
              "huggingface.co/docs/diffusers/optimization/torch2.0), the tables 'T4 (batch "
              "size: 1)', 'V100 (batch size: 1)', 'A100 (batch size: 1)', row 'SD - txt2img', "
              "columns 'torch 2.0 - no compile' and 'torch 2.0 - compile'")
_TORCH2_SET = ("runwayml/stable-diffusion-v1-5 in fp16, 512x512, the pipeline's default 50 steps, "
               "batch 1, SDPA, UNet channels_last; compile: the UNet, mode='reduce-overhead', "
               "fullgraph; diffusers 0.17.0.dev0; iterations a second")
_STABLE_FAST = ("chengzeyi/stable-fast README.md, 'Performance Comparison', the tables 'H100' "
               "and 'A100', rows 'Vanilla PyTorch (2.1.0)' and 'torch.compile (2.1.0, "
               "max-autotune)'")
_SF_SET = ("fp16, batch 1, SD 1.5 at 512x512, SD XL at 1024x1024; it/s timed with CUDA events; "
           "torch 2.1.0; A100 memory size not stated")
_SF_SYNC = ("not used: torch 2.1 on a 2023 pipeline whose scheduler synced with the host every "
            "step (the sigmas on the GPU; diffusers PR 6173, in the blog's runs, moved them to "
            "the CPU), which caps what compile can win; the blog's A100 gains without it: "
            "1.30x SDXL, 2.36x SD1.5")
_TRT_CARD = ("huggingface.co/stabilityai/stable-diffusion-xl-1.0-tensorrt model card, 'Timings "
            "for 30 steps at 1024x1024', column 'Baseline (non-optimized)'")
_TRT_SET = "SDXL base, 1024x1024, 30 steps, batch 1, the card's non-optimized (PyTorch) baseline"
_ALEXEIGOR = ("github.com/alexeigor/sd-benchmarks README.md, column 'PT2.0,fp16,xformers'")
_ALEX_SET = ("runwayml/stable-diffusion-v1-5, fp16, xFormers attention, 512x512, batch 1; "
             "steps not stated, taken as the pipeline's default 50")
_TORCHAO = ("sayakpaul/diffusers-torchao README.md, 'Flux.1 Dev Benchmarks' (FLUX_H100_WHERE "
           "below)")
_TORCHAO_SET = "FLUX.1-dev, bf16, 1024x1024, 28 steps, batch 1; compile: max-autotune"

# each source by a short name (what a figure's basis says), and where it is
SOURCES = {"blog SDXL CSV": _SDXL_CSV, "blog SSD-1B CSV": _SSD1B_CSV,
           "blog SD1.5 CSV": _SD15_CSV, "blog PixArt CSV": _PIXART_CSV,
           "this project's H100": _OURS_FILE, "this project's H100, course ladder": _COURSE_FILE, "diffusers-torchao": _TORCHAO,
           "diffusers Torch 2.0 page": _TORCH2_DOC, "stable-fast": _STABLE_FAST,
           "SDXL TensorRT card": _TRT_CARD, "alexeigor/sd-benchmarks": _ALEXEIGOR}
COURSE = "this project's H100, course ladder"
OURS, TORCH2_DOC, STABLE_FAST = "this project's H100", "diffusers Torch 2.0 page", "stable-fast"
TRT_CARD, ALEXEIGOR, TORCHAO = "SDXL TensorRT card", "alexeigor/sd-benchmarks", "diffusers-torchao"


def _blog(model: str, csv: str, figures: dict[str, str]) -> list[Published]:
    return [Published("a100-80", "A100-80GB (400 W)", model, path, float(quote), "s", 30, csv,
                      quote, _BLOG) for path, quote in figures.items()]


PUBLISHED: list[Published] = [
    *_blog("sdxl", "blog SDXL CSV", {"tf32": "7.362", "half": "4.626", "sdpa": "3.315",
                               "compiled": "2.538"}),
    *_blog("ssd1b", "blog SSD-1B CSV", {"tf32": "4.813", "half": "3.068", "sdpa": "2.245",
                                 "compiled": "1.646"}),
    *_blog("sd15", "blog SD1.5 CSV", {"tf32": "1.512", "half": "1.302", "sdpa": "1.178",
                               "compiled": "0.500"}),
    *_blog("pixart", "blog PixArt CSV", {"tf32": "9.339", "half": "5.604", "sdpa": "3.085",
                                   "compiled": "2.658"}),
    Published("h100", "NVIDIA H100 80GB HBM3", "sdxl", "tf32", 3.79, "s", 30, OURS, "3.79",
              _OURS_SET),
    Published("h100", "NVIDIA H100 80GB HBM3", "sdxl", "half", 3.01, "s", 30, OURS, "3.01",
              _OURS_SET),
    Published("h100", "NVIDIA H100 80GB HBM3", "sdxl", "sdpa", 2.30, "s", 30, OURS, "2.30",
              _OURS_SET),
    # true fp32 (TF32 off): the one measured figure of that path; fp32 on other cards is
    # computed at the share of the FP32 datasheet rate it reached (image_time.FP32_SHARE)
    Published("h100", "NVIDIA H100 80GB HBM3", "sdxl", "fp32", 12.96, "s", 30, COURSE, "12.96",
              _COURSE_SET),
    Published("h100", "NVIDIA H100 80GB HBM3", "sdxl", "tf32", 3.97, "s", 30, COURSE, "3.97",
              _COURSE_SET, "check"),
    Published("h100", "NVIDIA H100 80GB HBM3", "sdxl", "half", 2.73, "s", 30, COURSE, "2.73",
              _COURSE_SET, "check"),
    Published("h100", "NVIDIA H100 80GB HBM3", "sdxl", "sdpa", 2.45, "s", 30, COURSE, "2.45",
              _COURSE_SET, "check"),
    Published("h100", "H100 80GB", "flux", "sdpa", 6.573, "s", 28, TORCHAO, "6.573",
              _TORCHAO_SET),
    Published("h100", "H100 80GB", "flux", "compiled", 4.209, "s", 28, TORCHAO, "4.209",
              _TORCHAO_SET),
    Published("t4", "T4", "sd15", "sdpa", 6.9, "it/s", 50, TORCH2_DOC, "6.9", _TORCH2_SET),
    Published("t4", "T4", "sd15", "compiled", 7.3, "it/s", 50, TORCH2_DOC, "7.3", _TORCH2_SET),
    Published("v100", "V100", "sd15", "sdpa", 18.99, "it/s", 50, TORCH2_DOC, "18.99",
              _TORCH2_SET),
    Published("v100", "V100", "sd15", "compiled", 20.95, "it/s", 50, TORCH2_DOC, "20.95",
              _TORCH2_SET),
    Published("a100-80", "A100 (memory size not stated)", "sd15", "sdpa", 21.66, "it/s", 50,
              TORCH2_DOC, "21.66", _TORCH2_SET, "check"),
    Published("a100-80", "A100 (memory size not stated)", "sd15", "compiled", 44.03, "it/s", 50,
              TORCH2_DOC, "44.03", _TORCH2_SET, "check"),
    Published("a10g", "A10 (GA102, 72 SMs; the A10G is AWS' GA102 with 80, and no tensor "
              "figure of its own: planning/gpus.py uses the A10's 125 TFLOPS)", "sdxl", "sdpa",
              9.399, "s", 30, TRT_CARD, "9399 ms", _TRT_SET),
    Published("a100-80", "A100 (memory size not stated)", "sdxl", "sdpa", 3.704, "s", 30,
              TRT_CARD, "3704 ms", _TRT_SET, "check"),
    Published("h100", "H100", "sdxl", "sdpa", 2.496, "s", 30, TRT_CARD, "2496 ms", _TRT_SET,
              "check"),
    # H100/A100 on SD1.5, both cards in one source: the H100's SD1.5 estimate is the blog's
    # A100 figure times this ratio (image_time.py, the same-source rule)
    Published("h100", "H100", "sd15", "sdpa", 54.5, "it/s", 0, STABLE_FAST, "54.5 it/s",
              _SF_SET, "ratio"),
    Published("a100-80", "A100", "sd15", "sdpa", 35.6, "it/s", 0, STABLE_FAST, "35.6 it/s",
              _SF_SET, "context", "the other end of the H100's ratio (stable-fast's own "
              "pipeline runs SD1.5 1.33x faster than the blog's on an A100)"),
    Published("h100", "H100", "sdxl", "sdpa", 14.9, "it/s", 0, STABLE_FAST, "14.9 it/s",
              _SF_SET, "check"),
    Published("a100-80", "A100", "sdxl", "sdpa", 8.7, "it/s", 0, STABLE_FAST, "8.7 it/s",
              _SF_SET, "check"),
    Published("h100", "H100", "sdxl", "compiled", 18.5, "it/s", 0, STABLE_FAST, "18.5 it/s",
              _SF_SET, "context", _SF_SYNC),
    Published("a100-80", "A100", "sdxl", "compiled", 10.0, "it/s", 0, STABLE_FAST,
              "10.0 it/s", _SF_SET, "context", _SF_SYNC),
    Published("h100", "H100", "sd15", "compiled", 66.0, "it/s", 0, STABLE_FAST, "66.0 it/s",
              _SF_SET, "context", _SF_SYNC),
    Published("a100-80", "A100", "sd15", "compiled", 41.9, "it/s", 0, STABLE_FAST,
              "41.9 it/s", _SF_SET, "context", _SF_SYNC),
    Published("a100-40", "A100-sxm4-40gb", "sd15", "sdpa", 1.96, "s", 50, ALEXEIGOR, "1.96 s",
              _ALEX_SET, "check"),
    Published("t4", "T4, 16gb", "sd15", "sdpa", 7.83, "s", 50, ALEXEIGOR, "7.83 s", _ALEX_SET,
              "check"),
]

# Published peaks, torch.cuda.max_memory_allocated() in GiB, one image at the native size
# (the blog's A100 runs, the CSVs above; "half": the larger of its bf16 and + SDPA rows).
PEAKS_GIB: dict[tuple[str, str], tuple[float, str]] = {
    ("sdxl", "fp32"): (16.827, "blog SDXL CSV"), ("sdxl", "half"): (8.961, "blog SDXL CSV"),
    ("ssd1b", "fp32"): (12.193, "blog SSD-1B CSV"), ("ssd1b", "half"): (6.603, "blog SSD-1B CSV"),
    ("sd15", "fp32"): (6.116, "blog SD1.5 CSV"), ("sd15", "half"): (3.071, "blog SD1.5 CSV"),
    ("pixart", "fp32"): (24.547, "blog PixArt CSV"),
    ("pixart", "half"): (12.573, "blog PixArt CSV"),
}


# --- the ladders as their sources published them (the reference numbers quote them) -------

# The blog's ladder, measured by its authors on an A100-80GB (seconds; 30 steps, batch 1; SD1.5
# at 512x512, the others at 1024x1024). Their "fp32" ran with TF32 matmuls on (run_benchmark.py
# sets torch.set_float32_matmul_precision("high") for every run). Where each row was read:
# BLOG_A100_WHERE.
BLOG_A100_SECONDS: dict[str, dict[str, float]] = {
    "sdxl": {"fp32": 7.36, "bf16": 4.63, "+ SDPA": 3.31, "+ compile": 2.54,
             "+ fused QKV": 2.52, "+ int8 dynamic": 2.43},
    "ssd1b": {"fp32": 4.813, "bf16": 3.068, "+ SDPA": 2.245, "+ compile": 1.646,
              "+ fused QKV": 1.636, "+ int8 dynamic": 1.573},
    "sd15": {"fp32": 1.512, "bf16": 1.302, "+ SDPA": 1.178, "+ compile": 0.500,
             "+ fused QKV": 0.494, "+ int8 dynamic": 0.525},
    "pixart": {"fp32": 9.339, "bf16": 5.604, "+ SDPA": 3.085, "+ compile": 2.658,
               "+ fused QKV": 2.624, "+ int8 dynamic": 2.619},
}
_CHARTS = ("huggingface/diffusion-fast README, 'Results from other pipelines', the {} chart "
           "(final-results-diffusion-fast/{}, a PNG): the blog and its repository publish this "
           "model's ladder only as that chart, and these figures are its bar labels")
BLOG_A100_WHERE: dict[str, str] = {
    "sdxl": ("the PyTorch blog 'Accelerating Generative AI Part III: Diffusion, Fast' and the "
             "diffusers guide 'Accelerate inference of text-to-image diffusion models', in their "
             "text (7.36 s fp32 ... 2.43 s int8 dynamic)"),
    "ssd1b": _CHARTS.format("SSD-1B", "SSD-1B,_Batch_Size:_1,_Steps:_30.png"),
    "sd15": _CHARTS.format("SD v1-5", "SD_v1-5,_Batch_Size:_1,_Steps:_30.png"),
    "pixart": _CHARTS.format("PixArt-alpha", "PixArt-$\\alpha$,_Batch_Size:_1,_Steps:_30.png"),
}

BLOG_SOURCE = ("PyTorch blog 'Accelerating Generative AI Part III: Diffusion, Fast' "
               "(A100-80GB, TF32 on in its fp32 step)")


def published_ladder(model: str, ladder: str) -> tuple[str, str, dict[str, float]] | None:
    """(GPU, source, seconds per step) published for this model's ladder, or None: the blog's
    A100 row for its ladder, diffusers-torchao's H100 figures for FLUX.1-dev's."""
    if ladder == "blog" and model in BLOG_A100_SECONDS:
        return "A100-80GB", BLOG_SOURCE, BLOG_A100_SECONDS[model]
    if ladder == "flux" and model == "flux":
        return "H100 80GB", FLUX_SOURCE, FLUX_H100_SECONDS
    return None


# FLUX.1-dev on an H100 80GB, 1024x1024, 28 steps, batch 1, seconds: sayakpaul/diffusers-
# torchao README.md (tables "Flux.1 Dev Benchmarks" and "Additional fp8dqrow results"), timed
# by its inference/benchmark_image.py (5 warm-up calls, then the mean of
# torch.utils.benchmark's blocked_autorange; torch.set_float32_matmul_precision("high")).
# The rows with fuse=False and compile_vae=False, so that each step changes one thing, as the
# course's Flux ladder does: its "+ compile" is channels_last + torch.compile(transformer,
# mode="max-autotune", fullgraph=True); fp8 is quantize_(transformer, float8_dynamic_
# activation_float8_weight()) on every linear of the transformer (quantize_'s default
# filter), per tensor or with granularity=PerRow().
FLUX_H100_SECONDS: dict[str, float] = {"bf16": 6.573, "+ compile": 4.209,
                                       "+ fp8 dynamic": 3.243, "+ fp8 dynamic row": 3.039}
# Its headline figure adds fused QKV projections and a compiled, fp8-quantized VAE decode.
FLUX_H100_BEST = {"seconds": 2.966, "what": "fp8 dynamic row + compile, with fused QKV "
                  "projections and the VAE decode compiled and fp8-quantized too"}
FLUX_SOURCE = ("sayakpaul/diffusers-torchao README (H100 80GB, FLUX.1-dev, 1024x1024, 28 "
               "steps, batch 1)")
FLUX_H100_WHERE = ("the diffusers-torchao README's 'Flux.1 Dev Benchmarks' table (batch 1, "
                   "fuse False, compile_vae False: None 6.573 s, compile 4.209 s, fp8dq + "
                   "compile 3.243 s) and its 'Additional fp8dqrow results' (3.039 s without "
                   "fusion or VAE compile; the 2.966 s headline has both)")
# Compile time of FLUX.1-dev's transformer on an H100, default mode: the PyTorch devlog
# "torch.compile and Diffusers: A Hands-On Guide to Peak Performance".
FLUX_COMPILE_SECONDS: dict[str, float] = {"full": 67.4, "regional": 9.6}


# Published parameter counts (CLIP-L and the T5-XXL encoder: the same towers as SD's and
# PixArt's, PUBLISHED_PARAMETERS below). The transformer is published only as "12
# billion parameters" (the FLUX.1-dev model card, black-forest-labs/FLUX.1-dev README.md): it
# counts 11,901,408,320 on the meta device (11,891,178,560 for schnell, without the guidance
# embedder); the VAE's count, 83,819,683, is counted from the hub's vae/config.json (no figure
# is published). tests/test_flux.py pins all four.
FLUX_PUBLISHED_PARAMETERS: dict[str, int] = {"text_encoder": 123_060_480,
                                             "text_encoder_2": 4_762_310_656}

# Published parameter counts (the models' cards and papers; SSD-1B's UNet only as "1.3B"),
# the check for weights="random".
PUBLISHED_PARAMETERS: dict[str, dict[str, int]] = {
    "sdxl": {"unet": 2_567_463_684, "vae": 83_653_863, "text_encoder": 123_060_480,
             "text_encoder_2": 694_659_840},
    "sd15": {"unet": 859_520_964, "vae": 83_653_863, "text_encoder": 123_060_480},
    "ssd1b": {"vae": 83_653_863, "text_encoder": 123_060_480,
              "text_encoder_2": 694_659_840},  # UNet: "1.3B" (arXiv 2401.02677)
    "pixart": {"transformer": 611_349_152, "vae": 83_653_863,
               "text_encoder": 4_762_310_656},
    "flux": FLUX_PUBLISHED_PARAMETERS, "flux-schnell": FLUX_PUBLISHED_PARAMETERS,
}

# What diffusion-fast loaded besides the pipeline (utils/pipeline_utils.py): every model but SD1.5
# gets the fp16-fix VAE (PixArt's own script, utils/pipeline_utils_pixart.py, does not swap it),
# and SD1.5 gets DPMSolverMultistepScheduler ("As the default scheduler of SD v1-5 doesn't have
# sigmas device placement", diffusers PR 6173). run_ladder(ladder="blog") loads with these.
BLOG_LOADING: dict[str, dict[str, str]] = {
    "sdxl": {"vae": "fp16-fix"}, "ssd1b": {"vae": "fp16-fix"},
    "sd15": {"scheduler": "dpm-solver"}, "pixart": {},
}
