"""What each notebook's smoke run did, per cell (course/planning/clock.py summarize): written by
`.venv/bin/python -m tools.clock_refresh out/clock` after a make test, checked against every
smoke run by tests/test_notebooks.py. Do not edit by hand."""

RECORDED: dict = {
    '00_setup.ipynb': {
        'nb00-15': {'benchmarks': [], 'calls': [], 'compiles': [], 'frames': 0, 'loads': ['sdxl']},
        'nb00-17': {'benchmarks': [], 'calls': [['sdxl', 'fp32']], 'compiles': [], 'frames': 0, 'loads': []},
        'nb00-11': {'benchmarks': [], 'calls': [], 'compiles': [], 'frames': 0, 'loads': ['sdxl']},
    },
    '01_baseline.ipynb': {
        'nb01-07': {'benchmarks': [], 'calls': [], 'compiles': [], 'frames': 0, 'loads': ['sdxl']},
        'nb01-timing': {'benchmarks': [], 'calls': [['sdxl', 'fp32'], ['sdxl', 'fp32'], ['sdxl', 'fp32'], ['sdxl', 'fp32']], 'compiles': [], 'frames': 0, 'loads': []},
        'nb01-09': {'benchmarks': [['sdxl', 'fp32', False]], 'calls': [], 'compiles': [], 'frames': 0, 'loads': []},
        'nb01-17': {'benchmarks': [], 'calls': [['sdxl', 'fp32'], ['sdxl', 'fp32'], ['sdxl', 'fp32']], 'compiles': [], 'frames': 0, 'loads': []},
        'nb01-19': {'benchmarks': [], 'calls': [['sdxl', 'fp32']], 'compiles': [], 'frames': 0, 'loads': []},
    },
    '02_precision.ipynb': {
        'nb02-05': {'benchmarks': [['sdxl', 'fp32', False]], 'calls': [], 'compiles': [], 'frames': 0, 'loads': ['sdxl']},
        'tf32-bench': {'benchmarks': [['sdxl', 'fp32', False]], 'calls': [], 'compiles': [], 'frames': 0, 'loads': []},
        'nb02-07': {'benchmarks': [['sdxl', 'half', False]], 'calls': [], 'compiles': [], 'frames': 0, 'loads': []},
        'nb02-09': {'benchmarks': [['sdxl', 'half', False]], 'calls': [], 'compiles': [], 'frames': 0, 'loads': ['sdxl']},
    },
    '03_attention.ipynb': {
        'nb03-05': {'benchmarks': [], 'calls': [], 'compiles': [], 'frames': 0, 'loads': ['sdxl']},
        'classic-bench': {'benchmarks': [['sdxl', 'half', False]], 'calls': [], 'compiles': [], 'frames': 0, 'loads': []},
        'nb03-07': {'benchmarks': [['sdxl', 'half', False]], 'calls': [], 'compiles': [], 'frames': 0, 'loads': []},
        'math-bench': {'benchmarks': [['sdxl', 'half', False]], 'calls': [], 'compiles': [], 'frames': 0, 'loads': []},
    },
    '04_torch_compile.ipynb': {
        'nb04-03': {'benchmarks': [], 'calls': [['sdxl', 'half']], 'compiles': [], 'frames': 0, 'loads': ['sdxl']},
        'nb04-05': {'benchmarks': [['sdxl', 'half', False]], 'calls': [], 'compiles': [], 'frames': 0, 'loads': []},
        'nb04-09': {'benchmarks': [], 'calls': [], 'compiles': [], 'frames': 0, 'loads': ['sdxl']},
        'nb04-11': {'benchmarks': [['sdxl', 'compiled', False]], 'calls': [], 'compiles': [], 'frames': 1, 'loads': []},
    },
    '05_cold_start.ipynb': {
        'compile-bench': {'benchmarks': [['sdxl', 'compiled', False]], 'calls': [], 'compiles': [['sdxl', 'default', 'regional', True, False, '{"attention": "sdpa", "channels_last": true, "compile": "default", "compile_scope": "regional", "dtype": "bf16", "fullgraph": true}']], 'frames': 2, 'loads': ['sdxl']},
        'nb04-13': {'benchmarks': [['sdxl', 'compiled', False]], 'calls': [], 'compiles': [['sdxl', 'default', 'regional', True, False, '{"attention": "sdpa", "channels_last": true, "compile": "default", "compile_scope": "regional", "dtype": "bf16", "fullgraph": true}']], 'frames': 2, 'loads': ['sdxl']},
        'from-artifacts': {'benchmarks': [['sdxl', 'compiled', False]], 'calls': [], 'compiles': [['sdxl', 'default', 'regional', True, False, '{"attention": "sdpa", "channels_last": true, "compile": "default", "compile_scope": "regional", "dtype": "bf16", "fullgraph": true}']], 'frames': 2, 'loads': ['sdxl']},
        'nb04-15': {'benchmarks': [['sdxl', 'compiled', False]], 'calls': [], 'compiles': [], 'frames': 0, 'loads': []},
        'recompile-report': {'benchmarks': [], 'calls': [['sdxl', 'compiled'], ['sdxl', 'compiled'], ['sdxl', 'compiled'], ['sdxl', 'compiled']], 'compiles': [], 'frames': 2, 'loads': []},
    },
    '06_fused_qkv.ipynb': {
        'nb05-03': {'benchmarks': [], 'calls': [], 'compiles': [], 'frames': 0, 'loads': ['sdxl']},
        'nb05-05': {'benchmarks': [['sdxl', 'half', False]], 'calls': [], 'compiles': [], 'frames': 0, 'loads': ['sdxl']},
        'nb05-07': {'benchmarks': [['sdxl', 'half', False]], 'calls': [], 'compiles': [], 'frames': 0, 'loads': []},
    },
    '07_gpu_syncs.ipynb': {
        'nb06-03': {'benchmarks': [['sd15', 'half', False]], 'calls': [], 'compiles': [], 'frames': 0, 'loads': ['sd15']},
        'nb06-08': {'benchmarks': [['sd15', 'half', False]], 'calls': [], 'compiles': [], 'frames': 0, 'loads': []},
        'keep-pndm': {'benchmarks': [], 'calls': [], 'compiles': [], 'frames': 0, 'loads': ['sd15']},
        'keep-pndm-bench': {'benchmarks': [['sd15', 'half', False]], 'calls': [], 'compiles': [], 'frames': 0, 'loads': []},
    },
    '08_int8_quantization.ipynb': {
        'nb07-05': {'benchmarks': [], 'calls': [], 'compiles': [], 'frames': 0, 'loads': ['sdxl']},
        'nb07-07': {'benchmarks': [], 'calls': [], 'compiles': [], 'frames': 0, 'loads': ['sdxl', 'sdxl']},
        'nb07-09': {'benchmarks': [['sdxl', 'half', False]], 'calls': [], 'compiles': [], 'frames': 0, 'loads': ['sdxl']},
        'nb07-11': {'benchmarks': [['sdxl', 'half', False]], 'calls': [], 'compiles': [], 'frames': 0, 'loads': []},
    },
    '09_fewer_denoiser_calls.ipynb': {
        'nb12-03': {'benchmarks': [], 'calls': [], 'compiles': [], 'frames': 0, 'loads': ['sdxl', 'sdxl', 'sdxl', 'sdxl']},
        'nb12-05': {'benchmarks': [['sdxl', 'fp32', False]], 'calls': [], 'compiles': [], 'frames': 0, 'loads': ['sdxl']},
        'nb12-07': {'benchmarks': [['sdxl', 'fp32', False]], 'calls': [], 'compiles': [], 'frames': 0, 'loads': []},
        'nb12-08': {'benchmarks': [['sdxl', 'fp32', False]], 'calls': [], 'compiles': [], 'frames': 0, 'loads': []},
        'cache-load': {'benchmarks': [], 'calls': [], 'compiles': [], 'frames': 0, 'loads': ['sdxl']},
        'nb12-13': {'benchmarks': [['sdxl', 'fp32', False]], 'calls': [], 'compiles': [], 'frames': 0, 'loads': []},
        'nb12-15': {'benchmarks': [['sdxl', 'compiled', False]], 'calls': [], 'compiles': [['sdxl', 'default', 'full', False, False, '{"attention": "sdpa", "cache_every": 3, "compile": "default", "compile_vae": false, "fullgraph": true}']], 'frames': 2, 'loads': ['sdxl']},
        'guidance-load': {'benchmarks': [], 'calls': [], 'compiles': [], 'frames': 0, 'loads': ['sdxl']},
        'guidance-callback': {'benchmarks': [], 'calls': [['sdxl', 'fp32']], 'compiles': [], 'frames': 0, 'loads': []},
        'nb12-17': {'benchmarks': [['sdxl', 'fp32', False]], 'calls': [['sdxl', 'fp32']], 'compiles': [], 'frames': 0, 'loads': []},
        'nb12-19': {'benchmarks': [['sdxl', 'fp32', False]], 'calls': [], 'compiles': [], 'frames': 0, 'loads': ['sdxl']},
    },
    '10_playground.ipynb': {
    },
    '11_fitting_your_gpu.ipynb': {
        'peak': {'benchmarks': [], 'calls': [['sdxl', 'fp32']], 'compiles': [], 'frames': 0, 'loads': ['sdxl']},
        'savers': {'benchmarks': [], 'calls': [['sdxl', 'fp32'], ['sdxl', 'fp32'], ['sdxl', 'fp32'], ['sdxl', 'fp32'], ['sdxl', 'fp32'], ['sdxl', 'fp32'], ['sdxl', 'fp32'], ['sdxl', 'fp32'], ['sdxl', 'fp32'], ['sdxl', 'fp32'], ['sdxl', 'fp32'], ['sdxl', 'fp32']], 'compiles': [], 'frames': 0, 'loads': ['sdxl', 'sdxl', 'sdxl', 'sdxl']},
    },
    '12_cuda_graphs.ipynb': {
        'load': {'benchmarks': [], 'calls': [], 'compiles': [], 'frames': 0, 'loads': ['sdxl']},
        'nb16-05': {'benchmarks': [['sdxl', 'compiled', False]], 'calls': [], 'compiles': [], 'frames': 1, 'loads': []},
    },
    '13_autotuning.ipynb': {
    },
    '14_lora_hotswap.ipynb': {
        'lora-files': {'benchmarks': [], 'calls': [], 'compiles': [], 'frames': 0, 'loads': ['sdxl']},
        'eager': {'benchmarks': [['sdxl', 'fp32', False], ['sdxl', 'fp32', False], ['sdxl', 'fp32', False], ['sdxl', 'fp32', False]], 'calls': [], 'compiles': [], 'frames': 0, 'loads': []},
        'fresh': {'benchmarks': [], 'calls': [], 'compiles': [], 'frames': 0, 'loads': ['sdxl']},
        'first': {'benchmarks': [['sdxl', 'compiled', False]], 'calls': [], 'compiles': [], 'frames': 1, 'loads': []},
        'swapped': {'benchmarks': [['sdxl', 'compiled', False]], 'calls': [], 'compiles': [], 'frames': 0, 'loads': []},
        'breaks': {'benchmarks': [], 'calls': [], 'compiles': [], 'frames': 0, 'loads': ['sdxl']},
        'without': {'benchmarks': [], 'calls': [['sdxl', 'compiled'], ['sdxl', 'compiled'], ['sdxl', 'compiled'], ['sdxl', 'compiled'], ['sdxl', 'compiled'], ['sdxl', 'compiled'], ['sdxl', 'compiled'], ['sdxl', 'compiled']], 'compiles': [['sdxl', 'reduce-overhead', 'full', False, False, 'compile_pipeline']], 'frames': 2, 'loads': ['sdxl']},
    },
    '15_fp8_hopper.ipynb': {
        'nb15-05': {'benchmarks': [], 'calls': [], 'compiles': [], 'frames': 0, 'loads': ['sdxl']},
    },
    '16_where_the_time_goes.ipynb': {
        'nb14-load': {'benchmarks': [], 'calls': [], 'compiles': [], 'frames': 0, 'loads': ['sdxl']},
        'nb14-plain': {'benchmarks': [], 'calls': [['sdxl', 'fp32'], ['sdxl', 'fp32']], 'compiles': [], 'frames': 0, 'loads': []},
        'nb14-03': {'benchmarks': [], 'calls': [['sdxl', 'fp32'], ['sdxl', 'fp32'], ['sdxl', 'fp32'], ['sdxl', 'fp32'], ['sdxl', 'fp32']], 'compiles': [], 'frames': 0, 'loads': []},
        'nb14-09': {'benchmarks': [], 'calls': [['sdxl', 'half'], ['sdxl', 'half'], ['sdxl', 'half'], ['sdxl', 'half'], ['sdxl', 'half'], ['sdxl', 'half'], ['sdxl', 'half'], ['sdxl', 'half'], ['sdxl', 'half'], ['sdxl', 'half'], ['sdxl', 'compiled'], ['sdxl', 'compiled'], ['sdxl', 'compiled'], ['sdxl', 'compiled'], ['sdxl', 'compiled']], 'compiles': [['sdxl', 'reduce-overhead', 'full', True, False, '{"attention": "sdpa", "channels_last": true, "compile": "reduce-overhead", "dtype": "bf16", "fullgraph": true}']], 'frames': 2, 'loads': ['sdxl', 'sdxl', 'sdxl']},
    },
    '17_all_models.ipynb': {
        'nb08-05': {'benchmarks': [['sdxl', 'fp32', False], ['sdxl', 'half', False], ['sdxl', 'half', False]], 'calls': [], 'compiles': [], 'frames': 0, 'loads': ['sdxl', 'sdxl', 'sdxl']},
        'nb08-07': {'benchmarks': [['sd15', 'fp32', False], ['sd15', 'half', False], ['sd15', 'half', False]], 'calls': [], 'compiles': [], 'frames': 0, 'loads': ['sd15', 'sd15', 'sd15']},
        'nb08-09': {'benchmarks': [['ssd1b', 'fp32', False], ['ssd1b', 'half', False], ['ssd1b', 'half', False]], 'calls': [], 'compiles': [], 'frames': 0, 'loads': ['ssd1b', 'ssd1b', 'ssd1b']},
        'nb08-11': {'benchmarks': [['pixart', 'fp32', False], ['pixart', 'half', False], ['pixart', 'half', False]], 'calls': [], 'compiles': [], 'frames': 0, 'loads': ['pixart', 'pixart', 'pixart']},
        'nb08-17': {'benchmarks': [['sdxl', 'fp32', False], ['sdxl', 'fp32', False], ['sdxl', 'half', False]], 'calls': [], 'compiles': [], 'frames': 0, 'loads': ['sdxl', 'sdxl', 'sdxl']},
    },
    '18_scale_out.ipynb': {
        'load-pipe': {'benchmarks': [], 'calls': [], 'compiles': [], 'frames': 0, 'loads': ['sd15']},
        'split': {'benchmarks': [], 'calls': [['sd15', 'fp32'], ['sd15', 'fp32']], 'compiles': [], 'frames': 0, 'loads': []},
        'batch-1': {'benchmarks': [], 'calls': [['sd15', 'fp32'], ['sd15', 'fp32'], ['sd15', 'fp32'], ['sd15', 'fp32'], ['sd15', 'fp32'], ['sd15', 'fp32'], ['sd15', 'fp32'], ['sd15', 'fp32'], ['sd15', 'fp32']], 'compiles': [], 'frames': 0, 'loads': ['sd15']},
        'batch-4': {'benchmarks': [], 'calls': [['sd15', 'fp32'], ['sd15', 'fp32'], ['sd15', 'fp32']], 'compiles': [], 'frames': 0, 'loads': ['sd15']},
        'launch': {'benchmarks': [], 'calls': [['sd15', 'fp32'], ['sd15', 'fp32'], ['sd15', 'fp32'], ['sd15', 'fp32'], ['sd15', 'fp32'], ['sd15', 'fp32'], ['sd15', 'fp32'], ['sd15', 'fp32'], ['sd15', 'fp32'], ['sd15', 'fp32'], ['sd15', 'fp32'], ['sd15', 'fp32'], ['sd15', 'fp32'], ['sd15', 'fp32'], ['sd15', 'fp32'], ['sd15', 'fp32'], ['sd15', 'fp32'], ['sd15', 'fp32'], ['sd15', 'fp32']], 'compiles': [], 'frames': 0, 'loads': ['sd15', 'sd15', 'sd15']},
    },
    '19_flux.ipynb': {
        'sizes': {'benchmarks': [], 'calls': [], 'compiles': [], 'frames': 0, 'loads': ['flux']},
        'load': {'benchmarks': [['flux', 'half', False]], 'calls': [['flux', 'half']], 'compiles': [], 'frames': 0, 'loads': ['flux']},
        'refusals': {'benchmarks': [], 'calls': [], 'compiles': [], 'frames': 0, 'loads': ['flux', 'flux', 'flux', 'flux']},
        'fbc-time': {'benchmarks': [['flux', 'half', False]], 'calls': [], 'compiles': [], 'frames': 0, 'loads': []},
        'hooks-cpu': {'benchmarks': [], 'calls': [['flux', 'fp32'], ['flux', 'fp32'], ['flux', 'fp32'], ['flux', 'fp32'], ['flux', 'fp32'], ['flux', 'fp32'], ['flux', 'fp32'], ['flux', 'fp32']], 'compiles': [], 'frames': 0, 'loads': ['flux', 'flux', 'flux', 'flux']},
        'ladder-steps': {'benchmarks': [['flux', 'half', False]], 'calls': [], 'compiles': [], 'frames': 0, 'loads': ['flux']},
    },
}
