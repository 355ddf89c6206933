"""models: the models of the course and how they load, the lowest layer.

    spec        the records: Component (a part built in code), ModelSpec (one model)
    presets     the models: hub ids, pipeline classes, full-size and tiny configs, the
                blog's loading choices (the blog's four here)
    flux        Flux.1 (dev and schnell): configs and published parameter counts
    build       pipelines built in code: the full-size architecture with random weights, or tiny
    pretrained  pretrained weights: are they here (a gated repository: may this token in?),
                what weights="auto" picks (never random unasked on a GPU), safetensors only
    hub         the Hugging Face hub, asked in one place: offline or not, file lists (cached),
                the local cache, downloads, a gated repository's access
    downloads   which files a load fetches in its dtype (fp16 ones for half precision),
                their bytes, said and the disk checked before it starts
    loading     load_pipeline (one path for the three weight sources), the pipeline's record
                (pipeline_info), the arguments of a call (call_kwargs), free_memory
    dtypes      the one dtype vocabulary: names, torch dtypes, bytes, fp32 or half, load_dtype;
                the compute capability bf16 graphs, flash attention and fp8 matmuls need
    fit         the one parameter count per model part; a model's estimated GPU peak in a dtype,
                size and batch; a load refused where it cannot fit
    meta        meta-device copies of a pipeline's parts and their inputs: what the FLOP
                count and the GEMM-shape count (what max-autotune benchmarks) run
    few_step    few-step distilled SDXL weights: hub files, the scheduler and steps each needs
    noise       the libraries' messages known to be harmless, silenced on the way in
    hooks       the core's two hooks: listeners of its events, a rule for weights="auto"
    state       a pipeline's state: the helpers' typed record of it (PipelineState, what
                pipeline_info returns) and what it is now, read off its modules (a denoiser
                compiled by hand)

Imports nothing of the package above it: only the ground (errors.py, checks.py).
"""
