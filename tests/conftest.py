import os
import sys
from pathlib import Path

import pytest

# The repository root, so that tests import this project's own tools as `tools.<name>` (the
# reference run, tools/reference/, lives outside the package: issue 58). `python -m pytest`
# puts the working folder first, but an xdist worker or a run from elsewhere need not.
_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the test machine has no hub access
os.environ.setdefault("TQDM_DISABLE", "1")

MODEL_KEYS = ["sdxl", "sd15", "ssd1b", "pixart", "flux"]
# The four models the blog ran: the tests of what Flux does not take (the fp32 classic-attention
# baseline, classifier-free guidance in a doubled batch, diffusers' Attention class) run on
# these; Flux's own are in tests/test_flux.py. FLUX.1-schnell is tested there too.
BLOG_MODEL_KEYS = MODEL_KEYS[:4]

# -- the suite spread over pytest-xdist workers (tools/test_suite.py, `make test`) --------------
# Tests that may run in any worker on their own: each notebook's smoke run starts its own
# kernel. Every other test runs in one worker with the rest of its module, in the module's
# order (test_readme's commands build on each other; module fixtures are built once).
ON_THEIR_OWN = {"test_notebook_runs_in_smoke_mode"}
SLOW_COST = 30  # an estimate, for the order only: a slow test against 1 for another


def unit_of_work(nodeid: str) -> str:
    """The unit an xdist worker takes whole: the test's module, or the test itself when it is
    ON_THEIR_OWN."""
    path, _, name = nodeid.partition("::")
    return nodeid if name.split("[")[0] in ON_THEIR_OWN else path


def pytest_configure(config):
    """In an xdist worker with another beside it: one torch thread (and OMP_NUM_THREADS=1 for
    the processes its tests start). torch's OpenMP threads spin while they wait for each other,
    so two workers of two threads each on two cores slow each other down many times over.
    Likewise one inductor compile thread (TORCHINDUCTOR_COMPILE_THREADS=1, read when inductor's
    config is imported): with the cores already taken by the workers, each process's pool of
    compile workers only adds their start-up (measured, the blog ladder's three compiled steps
    in a new process on an empty cache: 205 CPU-s against 222 with the pool of two). It is not
    part of inductor's cache key (torch/_inductor/config.py, _cache_config_ignore_prefix), so
    the graphs are the same ones, from the same cache, as `make demo`'s own compile processes
    (course/runs/demo.py) also take them."""
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
        os.environ["OMP_NUM_THREADS"] = "1"
        os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
        import torch

        torch.set_num_threads(1)
    if os.environ.get("FASTDIFF_CACHE_DIR"):  # after the threads: this imports torch
        # make test's one fresh compile cache (tools/test_suite.py) for every compile in this
        # process too, not only those that go through the course's rule: a plain torch.compile,
        # or fdh.apply without tuning=, would otherwise write into inductor's own default
        # folder (/tmp/torchinductor_<user>), which outlives the run, so a second run on the
        # same machine found those graphs compiled and a clean machine (CI) did not (measured:
        # the memory savers' compiled test, 171 s in one run, 17 s in the next)
        from fastdiff_helpers.course.planning.compile_cache import use_course_cache

        use_course_cache(verbose=False)


@pytest.hookimpl(optionalhook=True)  # an xdist hook: a machine without xdist never calls it
def pytest_xdist_make_scheduler(config, log):
    """xdist's own scope scheduling, with unit_of_work as the scope. (Its `loadgroup` marks do
    not reach the scheduler under pytest 9.2: xdist renames `item._nodeid`, and pytest 9.2's
    `nodeid` reads `item._id`, _pytest/nodes.py.) The units go out in collection order
    (--no-loadscope-reorder), which pytest_collection_modifyitems sets."""
    from xdist.scheduler import LoadScopeScheduling

    class ByUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of_work(nodeid)

    return ByUnit(config, log)


def pytest_collection_modifyitems(config, items):
    """Under xdist: the units of work (unit_of_work) in the order of their estimated cost,
    longest first, so that no long unit starts last while the other worker idles."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    units: dict[str, list] = {}
    for item in items:
        units.setdefault(unit_of_work(item.nodeid), []).append(item)

    def cost(unit):
        return sum(SLOW_COST if item.get_closest_marker("slow") else 1 for item in unit)

    items[:] = [item for unit in sorted(units.values(), key=cost, reverse=True) for item in unit]


_KEEP_TUNING = []  # the session's TuningWatch, when FASTDIFF_KEEP_TUNING names a bundle


def pytest_sessionstart(session):
    """FASTDIFF_KEEP_TUNING=BUNDLE (tools/gpu_slot.sh verdict on a GPU): what the session's
    compiles tune grows BUNDLE as it goes (fdh.course.TuningWatch: every 30 s, at the end, on the
    SIGTERM of `timeout`), so a cut GPU command keeps its tuning."""
    bundle = os.environ.get("FASTDIFF_KEEP_TUNING")
    if bundle:
        from fastdiff_helpers.course.compiletime.watch import TuningWatch

        watch = TuningWatch(bundle, "gpu-tests", command="pytest " + " ".join(
            str(a) for a in session.config.invocation_params.args))
        _KEEP_TUNING.append(watch.__enter__())


def pytest_sessionfinish(session, exitstatus):
    while _KEEP_TUNING:
        _KEEP_TUNING.pop().__exit__(None, None, None)


@pytest.fixture(scope="session")
def tiny_pipes():
    """One tiny pipeline per model, loaded once (tests that modify a pipeline load their own)."""
    import fastdiff_helpers as fdh
    return {m: fdh.load_pipeline(m, weights="tiny", device="cpu") for m in MODEL_KEYS}


def denoiser_only_kwargs(pipe, steps: int = 2) -> dict:
    """SD1.5 call kwargs whose call runs the UNet and nothing else that attends: prompts
    encoded beforehand (the text encoder is transformers' CLIP, whose SDPA no Recipe pins:
    set_attention touches the denoiser and VAE only) and latent output (no VAE decode).

    Found on an H100 (results/h100-80gb-hbm3/gpu-tests.md): profiling the whole call saw the
    text encoder's unpinned attention beside the UNet's pinned flash kernels."""
    import torch
    import fastdiff_helpers as fdh

    kwargs = fdh.call_kwargs(pipe, steps=steps)
    kwargs["output_type"] = "latent"
    with torch.inference_mode():
        embeds, negative = pipe.encode_prompt(kwargs.pop("prompt"), pipe.device, 1, True,
                                              kwargs.pop("negative_prompt", None))
    kwargs.update(prompt_embeds=embeds, negative_prompt_embeds=negative)
    return kwargs


def eager_compiled_block(block):
    """A UNet transformer block compiled by dynamo alone (backend="eager": guards, frames and
    recompiles are dynamo's whatever the backend, in seconds on a CPU), and a function that
    calls it, without grad as the pipelines do, on fixed random inputs of its sizes."""
    import torch

    block.compile(backend="eager", fullgraph=True)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(1, 16, block.attn1.to_q.in_features, generator=generator)
    context = torch.randn(1, 8, block.attn2.to_k.in_features, generator=generator)

    def call():
        with torch.no_grad():
            block(x, encoder_hidden_states=context)
    return call


@pytest.fixture(autouse=True)
def duck_sizing_restored():
    """compile_pipeline(dynamic=True) turns torch's duck sizing off for the whole process, as the
    diffusers guide does (techniques/compile.py): each test ends with torch's default back, so
    one test's recipe never changes another's compile (test_schema's dynamic recipes made
    test_blog_fidelity's duck-sizing test fail when it ran after them in one process)."""
    yield
    config = sys.modules.get("torch.fx.experimental._config")
    if config is not None:
        config.use_duck_shape = True
