"""measure: what a measurement reads and the Result it returns, above the models and the
techniques.

    bench           benchmark(): cold start, warm-up, synchronised timing -> a Result
    record          the Result record (one benchmarked configuration, one versioned schema),
                    and how its numbers are written (seconds, memory, PSNR, the denoising)
    timing          what benchmark() times with: stage marks, progress bar, steadiness
    env             env_report(): versions, device, GPU and numeric flags behind a timing
    compile_events  what torch.compile did during a call (frames, cache hits, seconds)
    cudagraphs      CUDA graphs captured, replayed, re-recorded, skipped (and why)
    flops           FLOPs per image, counted from the architecture; the matmul rate
    quality         image quality against the baseline: PSNR, SSIM, max abs error, NaN
    memory          weight bytes from the architecture, a call's peak memory, what fits a card
    profile         profile(): where one image's time goes, per stage and per kind of work

Imports the models and the techniques (a Result records the recipe a pipeline runs), nothing
of results or the course layer. The course's own comparisons built on these (memory savers,
LoRA swaps, cache hooks, recompiles) are course/; what compiling leaves behind, course/compiletime/.
"""
