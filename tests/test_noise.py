"""Known library noise is silenced narrowly (issue 15): the listed messages only."""

from __future__ import annotations

import subprocess
import sys

CODE = """
import logging, warnings
import fastdiff_helpers as fdh
pipe = fdh.load_pipeline("sd15", weights="tiny", device="cpu", verbose=False)  # imports diffusers, torchao
log = logging.getLogger("torchao")
log.warning("Failed to load /x/torchao/_C_mxfp8.so: gone")      # listed: dropped
log.warning("Failed to load the model weights")                    # not listed: shown
logging.getLogger("transformers.utils.import_utils").warning("`CLIPImageProcessor` requires torchvision (not installed); x")
exec(compile("import warnings; warnings.warn('Dynamo detected a call to a `functools.lru_cache`-wrapped function at x')",
             "<d>", "exec"), {"__name__": "torch._dynamo.variables.functions"})
warnings.warn("Dynamo detected a call to a `functools.lru_cache`-wrapped function from elsewhere")  # other module: shown
from fastdiff_helpers.models.noise import quiet_known_noise
quiet_known_noise(False)
log.warning("Failed to load /x/torchao/_C_cutlass.so: shown again")
"""


def test_only_the_listed_messages_are_silenced():
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=True)
    text = out.stderr
    for noise in ("site-packages/torchao/_C", "is an Enum subclass", "Unable to import `torchao`",
                  "requires torchvision", "_C_mxfp8.so: gone"):
        assert noise not in text, noise
    assert "Failed to load the model weights" in text
    assert "from elsewhere" in text and "lru_cache`-wrapped function at x" not in text
    assert "shown again" in text


def test_count_flops_as_the_first_call_is_quiet_too():
    """fdh.count_flops("sd15") as a notebook's first call imported diffusers (through the
    components' config classes) before silencing the known noise: torchao's four lines showed."""
    code = "import fastdiff_helpers as fdh; print(fdh.count_flops('sd15')['calls'])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    for noise in ("site-packages/torchao/_C", "is an Enum subclass", "Unable to import `torchao`"):
        assert noise not in out.stderr, noise
    assert out.stdout.split() == ["31"]  # PNDM, SD1.5's own scheduler: steps + 1 denoiser calls


def test_a_meta_build_as_the_first_import_of_diffusers_is_quiet_too():
    """The plan and `download` (and fdh.weight_bytes) build full-size pipelines on the meta
    device (models/build.py), which imported diffusers before silencing the known noise: a
    participant's `python -m fastdiff_helpers plan --gpu t4` printed torchao's and
    transformers' lines on stderr (seven of them with this requirements.txt)."""
    code = "import fastdiff_helpers as fdh; print(sum(fdh.weight_bytes('sd15', 'fp32').values()))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    for noise in ("site-packages/torchao/_C", "is an Enum subclass", "Unable to import `torchao`",
                  "requires torchvision"):
        assert noise not in out.stderr, noise
    from fastdiff_helpers.course.planning.published import PUBLISHED_PARAMETERS

    assert int(out.stdout) == 4 * sum(PUBLISHED_PARAMETERS["sd15"].values())  # fp32: 4 bytes each
