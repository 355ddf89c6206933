"""models: the models of the course and how they load, the lowest layer.

    spec        the records: Component (a part built in code), ModelSpec (one model); shared parts
    presets     the models: hub ids, pipeline classes, full-size and tiny configs (the blog's four)
    flux        Flux.1 (dev and schnell): configs and published parameter counts
    build       pipelines built in code: the full-size architecture with random weights, or tiny
    pretrained  pretrained weights: are they here, what weights="auto" picks, safetensors only
    hub         the Hugging Face hub, asked in one place (offline, files, cache, gated access)
    downloads   which files a load fetches in its dtype, their bytes, said and the disk checked
    loading     load_pipeline, the pipeline's record (pipeline_info), call_kwargs, free_memory
    dtypes      the one dtype vocabulary, and the compute capability bf16, flash and fp8 need
    fit         the parameters per model part; a model's estimated GPU peak; a load that cannot fit
    meta        meta-device copies of a pipeline's parts and their inputs (FLOPs, GEMM shapes)
    few_step    few-step distilled SDXL weights: hub files, the scheduler and steps each needs
    noise       the libraries' messages known to be harmless, silenced on the way in
    hooks       the core's two hooks: listeners of its events, a rule for weights="auto"
    state       a pipeline's state: its typed record (PipelineState), a denoiser compiled by hand

Imports nothing of the package above it: only the ground (errors.py, checks.py).
"""
