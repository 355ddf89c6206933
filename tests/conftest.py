import os
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the test machine has no hub access
os.environ.setdefault("TQDM_DISABLE", "1")

MODEL_KEYS = ["sdxl", "sd15", "ssd1b", "pixart"]


@pytest.fixture(scope="session")
def tiny_pipes():
    """One tiny pipeline per model, loaded once (tests that modify a pipeline load their own)."""
    import fastdiff_helpers as fdh
    return {m: fdh.load_pipeline(m, weights="tiny", device="cpu") for m in MODEL_KEYS}
