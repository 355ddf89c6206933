"""measure: what a measurement reads and the Result it returns, above the models and the
techniques.

    bench           benchmark(): cold start, warm-up, synchronised timing -> a Result
    record          the Result record (one benchmarked configuration, one versioned schema)
    timing          what benchmark() times with: stage marks, progress bar, steadiness
    env             env_report(): versions, device, GPU and numeric flags behind a timing
    compile_events  what torch.compile did during a call (frames, cache hits, seconds)
    recompiles      what a compiled pipeline recompiles for (resolution, a weight)
    cudagraphs      CUDA graphs captured, replayed, re-recorded, skipped (and why)
    flops           FLOPs per image, counted from the architecture; the matmul rate
    quality         image quality against the baseline: PSNR, SSIM, max abs error, NaN
    lora_swaps      what switching LoRAs on a compiled pipeline recompiles and re-records
    memory          weight bytes from the architecture, a call's peak memory, what fits a card
    savers_report   each memory saver's peak memory and time, beside the pipeline without it
    cache_hooks     diffusers' cache hooks (FirstBlockCache, TaylorSeer) against the course's
                    step cache on Flux: what runs, host reads, what dynamo compiles
    profile         profile(): where one image's time goes, per stage and kind of work (the
                    kinds: matmul, convolution, attention... by op and kernel name)

Imports the models and the techniques (a Result records the recipe a pipeline runs), nothing
of planning, compiletime, results, course or runs. What compiling costs and leaves behind
(tuning, compile artifacts) is compiletime/; the course clock, course/planning/clock.py.
"""
