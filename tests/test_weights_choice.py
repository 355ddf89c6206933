"""Issue 46, deliverable 4: weights decided once, gated repositories recognised. The hub is
simulated: huggingface_hub's model_info, auth_check and try_to_load_from_cache are replaced,
and a refused gate is the library's own error, made by its hf_raise_for_status from the
response the hub sends (utils/_http.py). A GPU is faked where the rule asks for one."""

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx2
import huggingface_hub
import pytest
import torch
from huggingface_hub.hf_api import ModelInfo
from huggingface_hub.utils import hf_raise_for_status

import fastdiff_helpers as fdh
from fastdiff_helpers.course import weights as weights_choice
from fastdiff_helpers.models import pretrained

ROOT = Path(__file__).resolve().parents[1]
FLUX = "black-forest-labs/FLUX.1-dev"


def hub_error(repo: str, status: int, code: str | None) -> Exception:
    """What auth_check raises for this answer of the hub: huggingface_hub's own mapping."""
    url = f"https://huggingface.co/api/models/{repo}/auth-check"
    response = httpx2.Response(status, headers={"X-Error-Code": code} if code else {},
                               request=httpx2.Request("GET", url))
    try:
        hf_raise_for_status(response)
    except Exception as exc:
        return exc
    raise AssertionError("the hub's answer raised nothing")


class Hub:
    """The hub as this test sets it: which repositories answer, which are gated, what the
    token may read; counts the questions."""

    def __init__(self):
        self.reachable, self.gated, self.let_in, self.asked = True, {}, set(), []

    def model_info(self, repo_id, timeout=None, **kw):
        self.asked.append(("model_info", repo_id))
        assert timeout == pretrained.HUB_TIMEOUT_S
        if not self.reachable:
            raise httpx2.ConnectError("no route to host")
        return ModelInfo(id=repo_id, gated=self.gated.get(repo_id, False))

    def auth_check(self, repo_id, **kw):
        self.asked.append(("auth_check", repo_id))
        if repo_id in self.let_in:
            return None
        raise hub_error(repo_id, 403, "GatedRepo")


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """Nothing cached, a reachable hub, no token, the carried choices in a fresh file."""
    fake = Hub()
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv(weights_choice.WEIGHTS_FILE_ENV, str(tmp_path / "carried" / "weights.json"))
    monkeypatch.setattr(huggingface_hub, "model_info", fake.model_info)
    monkeypatch.setattr(huggingface_hub, "auth_check", fake.auth_check)
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda *a, **k: None)
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    return fake


@pytest.fixture
def fake_gpu(monkeypatch):
    """torch.cuda.is_available() says yes; course_settings' tuning import is left out (it
    reads the GPU's name)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr("fastdiff_helpers.course.parameters.import_course_tuning", lambda t=None: [])
    # course_settings sizes the course for the card (course/planning/sizing.py): an H100's properties
    props = fdh.course.gpu_profile("h100").properties()
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a, **k: props)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, **k: (9, 0))


def carried() -> dict:
    path = weights_choice.weights_file()
    return json.loads(path.read_text()) if path.exists() else {}


# -- gated repositories: the hub's `gated` field and the token's access ---------------------

def test_a_gated_repository_without_access_is_not_reachable_and_says_how_to_get_in(hub):
    hub.gated[FLUX] = "manual"
    ok, why, _ = pretrained.pretrained_status(fdh.MODELS["flux"])
    assert not ok and "gated: needs access" in why and "reachable" not in why
    assert "no Hugging Face token on this machine" in why
    assert ("auth_check", FLUX) in hub.asked
    assert fdh.course.choose_weights(fdh.MODELS["flux"], None, "cpu")[0] == "tiny"
    weights, why = fdh.course.choose_weights(fdh.MODELS["flux"], None, "cuda")
    assert weights == "none" and "gated: needs access" in why
    for said in (f"https://huggingface.co/{FLUX}", "hf auth login", "HF_TOKEN",
                 "wait for its authors to approve"):  # "manual": the authors approve
        assert said in why, said
    assert f"hf download {FLUX}" not in why  # no download before access


def test_load_pipeline_refuses_a_gated_repository_before_any_download(hub, monkeypatch):
    hub.gated[FLUX] = "auto"
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: "hf_token_of_another_account")
    import diffusers

    def never(*a, **k):
        raise AssertionError("from_pretrained was called")

    monkeypatch.setattr(diffusers.FluxPipeline, "from_pretrained", never)
    with pytest.raises(fdh.FastdiffError) as err:
        fdh.load_pipeline("flux", weights="pretrained", device="cpu", dtype="bf16")
    msg = str(err.value)
    assert "gated: needs access" in msg and "the token on this machine has no access" in msg
    assert f"https://huggingface.co/{FLUX}" in msg and "hf auth login" in msg
    assert "safetensors" not in msg and "approve" not in msg  # "auto": accepting is enough


def test_a_token_without_valid_credentials_is_refused_as_not_found(hub, monkeypatch):
    """The hub answers 401 to a request without a valid token: huggingface_hub raises
    RepositoryNotFoundError, of which GatedRepoError is a kind (errors.py)."""
    hub.gated[FLUX] = "auto"
    monkeypatch.setattr(hub, "auth_check", lambda repo_id, **k: (_ for _ in ()).throw(
        hub_error(repo_id, 401, None)))
    monkeypatch.setattr(huggingface_hub, "auth_check", hub.auth_check)
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: "hf_expired")
    ok, why, _ = pretrained.pretrained_status(fdh.MODELS["flux"])
    assert not ok and "gated: needs access" in why and "was refused" in why


def test_a_gated_repository_with_access_is_reachable(hub):
    hub.gated[FLUX] = "manual"
    hub.let_in.add(FLUX)
    ok, why, _ = pretrained.pretrained_status(fdh.MODELS["flux"])
    assert ok and "reachable" in why and "the token here has access" in why
    assert hub.asked == [("model_info", FLUX), ("auth_check", FLUX)]
    assert fdh.course.choose_weights(fdh.MODELS["flux"], None, "cuda")[0] == "pretrained"


def test_an_access_check_that_never_answers_counts_as_unreachable(hub, monkeypatch):
    """auth_check takes no timeout and its client has none: it is waited for HUB_TIMEOUT_S.
    Here it answers only once the status is back: the status came first (an order, not a
    duration, so a busy machine cannot fail it)."""
    import threading

    hub.gated[FLUX] = "auto"
    release, answered = threading.Event(), []

    def never_answers(repo_id, **k):
        release.wait(60)
        answered.append(repo_id)

    monkeypatch.setattr(huggingface_hub, "auth_check", never_answers)
    monkeypatch.setattr(pretrained, "HUB_TIMEOUT_S", 0.2)
    monkeypatch.setattr(hub, "model_info", lambda repo_id, timeout=None: ModelInfo(
        id=repo_id, gated="auto"))
    monkeypatch.setattr(huggingface_hub, "model_info", hub.model_info)
    try:
        ok, why, _ = pretrained.pretrained_status(fdh.MODELS["flux"])
        assert answered == []  # back before the check answered
    finally:
        release.set()
    assert not ok and "did not answer its access check" in why


def test_a_gate_refused_inside_from_pretrained_is_said_as_a_gate(tmp_path, monkeypatch):
    """diffusers turns a refused model_info into an EnvironmentError raised from it
    (pipelines/pipeline_utils.py, DiffusionPipeline.download)."""
    import diffusers

    def refused(*a, **k):
        raise EnvironmentError("Cannot load model: not fully cached") from hub_error(
            FLUX, 403, "GatedRepo")

    monkeypatch.setattr(diffusers.FluxPipeline, "from_pretrained", refused)
    with pytest.raises(fdh.FastdiffError) as err:
        pretrained.load_pretrained(fdh.MODELS["flux"], None, torch.bfloat16)
    assert "gated" in str(err.value) and "hf auth login" in str(err.value)
    assert "safetensors" not in str(err.value)


# -- "auto" on a GPU: the choice carried, or a stop; never random unasked -------------------

def test_auto_on_a_gpu_without_weights_stops_and_says_what_to_do(hub, fake_gpu, capsys):
    hub.reachable = False
    with pytest.raises(fdh.FastdiffError) as err:
        fdh.course.settings("sdxl")
    msg = str(err.value)
    assert "the hub is unreachable" in msg and "reconnect" in msg
    assert "hf download stabilityai/stable-diffusion-xl-base-1.0" in msg
    assert "weights='random'" in msg and "every image is noise" in msg
    with pytest.raises(fdh.FastdiffError, match="stops rather than pick random weights"):
        fdh.load_pipeline("sd15", weights="auto")  # a "Try it yourself" cell
    assert not weights_choice.weights_file().exists()
    # on the CPU the tiny model stays the quiet default, and nothing is carried
    cpu = fdh.course.settings("sdxl", smoke=True)
    assert cpu.weights == "tiny" and cpu.device == "cpu"
    assert fdh.course.choose_weights(fdh.MODELS["sdxl"], None, "cpu")[0] == "tiny"
    assert not weights_choice.weights_file().exists()


def test_random_asked_for_by_name_is_said_loudly_and_carried_per_model(hub, fake_gpu, capsys):
    hub.reachable = False
    settings = fdh.course.settings("sdxl", weights="random")
    out = capsys.readouterr().out
    assert settings.weights == "random" and "RANDOM WEIGHTS" in out and "noise" in out
    assert carried()["sdxl"]["weights"] == "random"
    hub.asked.clear()
    # a later notebook: "auto" reads the choice back, says it loudly, asks the hub nothing
    again = fdh.course.settings("sdxl")
    out = capsys.readouterr().out
    assert again.weights == "random" and "RANDOM WEIGHTS" in out and not hub.asked
    assert pretrained.resolve_weights("sdxl", "auto", "cuda", verbose=False) == "random"
    assert "RANDOM WEIGHTS" in capsys.readouterr().out  # verbose=False hides no random choice
    # the choice is per model: SD1.5 was never chosen, and "auto" stops for it
    with pytest.raises(fdh.FastdiffError, match="No weights for 'sd15' on this GPU"):
        fdh.course.settings("sd15")
    # asking for the pretrained weights by name replaces the choice
    hub.reachable = True
    assert fdh.course.settings("sdxl", weights="pretrained").weights == "pretrained"
    assert carried()["sdxl"]["weights"] == "pretrained"


def test_pretrained_chosen_once_then_gone_stops_instead_of_random(hub, fake_gpu):
    assert fdh.course.settings("sdxl").weights == "pretrained"  # reachable: chosen, carried
    assert carried()["sdxl"]["weights"] == "pretrained"
    hub.reachable = False  # the workshop's Wi-Fi, two notebooks later
    with pytest.raises(fdh.FastdiffError) as err:
        fdh.course.settings("sdxl")
    assert "a parameters cell chose pretrained weights for sdxl" in str(err.value)
    assert "weights='random'" in str(err.value)


def test_a_cached_gated_model_is_pretrained_without_a_hub_question(hub, fake_gpu, tmp_path,
                                                                     monkeypatch):
    snapshot = tmp_path / "snapshot"
    for name in fdh.MODELS["flux"].full:
        (snapshot / name).mkdir(parents=True)
        (snapshot / name / "model.safetensors").write_text("")
    (snapshot / "model_index.json").write_text("{}")
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache",
                        lambda repo, name, **k: str(snapshot / name))
    hub.gated[FLUX], hub.reachable = "manual", False
    assert fdh.course.settings("flux").weights == "pretrained"
    assert not hub.asked
    assert carried()["flux"]["weights"] == "pretrained"


def test_the_carried_choice_is_read_back_by_another_process(hub, fake_gpu, tmp_path):
    hub.reachable = False
    fdh.course.settings("sdxl", weights="random")
    code = ("import torch; torch.cuda.is_available = lambda: True\n"
            "import fastdiff_helpers as fdh\n"
            "from fastdiff_helpers.models.hooks import auto_weights\n"
            "from fastdiff_helpers.course.weights import carried_rule\n"
            "auto_weights(carried_rule)\n"  # what course settings do in every notebook
            "print(fdh.course.choose_weights(fdh.MODELS['sdxl'], None, 'cuda')[0])\n"
            "print(fdh.course.choose_weights(fdh.MODELS['sd15'], None, 'cuda')[0])\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1",
               HF_HUB_CACHE=str(tmp_path / "empty-cache"))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["random", "none"]


def test_the_file_is_replaced_whole_and_a_broken_one_is_ignored(hub, monkeypatch, capsys):
    assert weights_choice.carry_choice("sdxl", "random", "asked for by name")
    before = weights_choice.weights_file().read_text()

    def interrupted(src, dst):
        raise OSError("disk full")

    replace = os.replace
    monkeypatch.setattr(os, "replace", interrupted)
    assert not weights_choice.carry_choice("sd15", "pretrained", "auto: available")
    assert "could not carry" in capsys.readouterr().out
    assert weights_choice.weights_file().read_text() == before  # the old file, whole
    assert [p.name for p in weights_choice.weights_file().parent.iterdir()] == ["weights.json"]
    monkeypatch.setattr(os, "replace", replace)


@pytest.mark.parametrize("text, said", [
    ('{"sdxl": {"weights": "rand', "cannot be read: not JSON"),
    ('["sdxl", "random"]', "not what fastdiff writes: a JSON list"),
    ('{"sdxl": {"weights": "banana"}, "sd15": {"weights": "random", "why": "x"}}',
     "not what fastdiff writes: sdxl carry no weights of pretrained, random"),
])
def test_a_file_that_is_not_the_courses_is_kept_aside_and_said(hub, capsys, text, said):
    """Corrupt JSON, a JSON list or an invalid choice was dropped (replaced on the next write,
    without a word for the last two): now kept aside whole, its new name said, once."""
    path = weights_choice.weights_file()
    path.parent.mkdir(parents=True)
    path.write_text(text)
    kept = {"sd15": {"weights": "random", "why": "x"}} if "banana" in text else {}
    assert weights_choice.carried_choices() == kept
    out = capsys.readouterr().out
    (aside,) = path.parent.glob("weights.json.bad-*")
    assert said in out and f"kept aside as {aside}" in out and out.count("\n") == 1
    assert aside.read_text() == text and not path.exists()
    assert weights_choice.carried_choices() == {} and capsys.readouterr().out == ""
    assert weights_choice.carry_choice("sdxl", "random", "asked for by name")
    assert json.loads(path.read_text())["sdxl"]["weights"] == "random"
    assert aside.read_text() == text  # the next write left it alone


def test_a_bad_file_that_cannot_be_moved_is_never_written_over(hub, monkeypatch, capsys):
    path = weights_choice.weights_file()
    path.parent.mkdir(parents=True)
    path.write_text("[]")

    def refuse(src, dst):
        raise PermissionError("read-only folder")

    monkeypatch.setattr(os, "replace", refuse)
    assert not weights_choice.carry_choice("sdxl", "random", "asked for by name")
    out = capsys.readouterr().out
    assert "cannot be moved aside" in out and "is not carried" in out
    assert path.read_text() == "[]"
