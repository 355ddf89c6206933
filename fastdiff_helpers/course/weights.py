"""The weights a parameters cell chose on a GPU, per model, carried to the later notebooks.

Each notebook is its own kernel process: what course settings chose there ("pretrained", or
"random" asked for by name: course_weights) is kept in one small JSON file, read back by
weights="auto" in every later notebook and process: course settings put carried_rule before
load_pipeline's own choice (models/hooks.py auto_weights). The file is
$FASTDIFF_WEIGHTS_FILE, else ~/.cache/fastdiff/weights.json (beside the course's compile cache,
course/planning/compile_cache.py): per user and machine, as the Hugging Face cache is. It is written
whole into a temporary file of the same folder and moved over the old one (os.replace), so a
kernel that reads it meanwhile sees the old choices or the new, never half a file. Only a
GPU's choices are kept: on a CPU "auto" decides as it always did (pretrained, else tiny).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

from .. import checks
from ..models.presets import ModelSpec, get_spec
from ..models.pretrained import NOISE, choose_weights, resolve_weights

WEIGHTS_FILE_ENV = "FASTDIFF_WEIGHTS_FILE"
CARRIED = ("pretrained", "random")  # the choices a later notebook's "auto" reads back


def weights_file() -> Path:
    """Where the course's weight choices are carried: $FASTDIFF_WEIGHTS_FILE, else
    ~/.cache/fastdiff/weights.json."""
    named = os.environ.get(WEIGHTS_FILE_ENV, "").strip()
    return Path(named) if named else Path.home() / ".cache" / "fastdiff" / "weights.json"


def carried_choices() -> dict[str, dict]:
    """{model: {"weights", "why", "when"}} as the file holds them; {} when there is none. A
    file that is not what this module writes is never lost: it is kept aside, renamed
    <name>.bad-<date>, and said with both paths, once (the choices it held that read as this
    module's are kept)."""
    return _read()[0]


def _read() -> tuple[dict[str, dict], bool]:
    """(the carried choices, whether the file may be written over: False where a file that is
    not this module's is still in place)."""
    path = weights_file()
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}, True
    except OSError as exc:
        print(f"fastdiff: the carried weight choices in {path} cannot be read "
              f"({type(exc).__name__}: {exc}): ignored, and left as they are")
        return {}, False
    except ValueError as exc:
        return {}, _set_aside(path, f"cannot be read: not JSON ({type(exc).__name__})")
    if not isinstance(data, dict):
        return {}, _set_aside(path, f"are not what fastdiff writes: a JSON "
                                    f"{type(data).__name__}, not an object of models")
    good = {model: entry for model, entry in data.items()
            if isinstance(entry, dict) and entry.get("weights") in CARRIED}
    bad = sorted(set(data) - set(good))
    if bad:
        return good, _set_aside(path, f"are not what fastdiff writes: {', '.join(bad)} "
                                      f"carry no weights of {', '.join(CARRIED)}")
    return good, True


def _set_aside(path: Path, why: str) -> bool:
    """Move a file that is not this module's out of the way, keeping it whole; True once it is
    out of the way."""
    aside = path.with_name(f"{path.name}.bad-{time.strftime('%Y%m%d-%H%M%S')}")
    n = 1
    while aside.exists():
        n += 1
        aside = path.with_name(f"{path.name}.bad-{time.strftime('%Y%m%d-%H%M%S')}-{n}")
    try:
        os.replace(path, aside)
    except OSError as exc:
        print(f"fastdiff: the carried weight choices in {path} {why}, and cannot be moved "
              f"aside ({type(exc).__name__}): ignored, and left as they are; fix or delete it")
        return False
    print(f"fastdiff: the carried weight choices in {path} {why}: kept aside as {aside}; "
          "the course decides afresh")
    return True


def carried_choice(model: str) -> dict | None:
    """The choice carried for `model` ({"weights", "why", "when"}), or None."""
    return carried_choices().get(model)


def carry_choice(model: str, weights: str, why: str) -> bool:
    """Keep `weights` as the course's choice for `model`, for the later notebooks. Returns
    whether the file now holds it (a folder that cannot be written is said, not raised: the
    parameters cell still runs, and the next notebook decides afresh)."""
    if weights not in CARRIED:
        raise ValueError(f"only {CARRIED} are carried, not {weights!r}")
    choices, writable = _read()
    path = weights_file()
    if not writable:
        print(f"fastdiff: weights={weights!r} for {model} is not carried to the later notebooks: "
              f"{path} is not this course's and stays as it is")
        return False
    if choices.get(model, {}).get("weights") == weights:
        return True  # the first choice's date and reason stay
    choices[model] = {"weights": weights, "why": why, "when": time.strftime("%Y-%m-%d %H:%M")}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(prefix=".weights-", suffix=".json", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(choices, fh, indent=1, sort_keys=True)
                fh.write("\n")
            os.replace(temporary, path)  # atomic on one file system (POSIX rename)
        except BaseException:
            os.unlink(temporary)
            raise
    except OSError as exc:
        print(f"fastdiff: could not carry weights={weights!r} for {model} to the later "
              f"notebooks ({type(exc).__name__}: {exc}); set {WEIGHTS_FILE_ENV} to a file in "
              "a folder you can write")
        return False
    return True


def carried_rule(spec: ModelSpec, path: str | None, device: str) -> tuple[str, str] | None:
    """weights="auto" as the course decides it on a GPU (course settings put it first,
    models/hooks.py): random weights a parameters cell asked for by name, said loudly each time;
    a pretrained choice, or a stop saying that it was chosen and is not here now; None (the
    helpers' own choice) where nothing is carried."""
    carried = carried_choice(spec.key) if path is None and device.startswith("cuda") else None
    if carried is None:
        return None
    if carried["weights"] == "random":  # asked for by name: no hub question
        return "random", (f"asked for in a parameters cell on {carried['when']}, carried in "
                          f"{weights_file()}: {NOISE}; for the pretrained weights put "
                          f"{checks.arg('weights', 'pretrained')} in the parameters cell")
    return choose_weights(spec, path, device, rules=False, before=(
        f"a parameters cell chose pretrained weights for {spec.key} on {carried['when']}, and "
        "they are not here now; "))


def course_weights(model: str | ModelSpec, weights: str, device: str) -> str:
    """course settings' weights: resolve_weights' choice; on a GPU, pretrained or random
    weights are carried to the later notebooks, and random weights asked for by name are said
    loudly."""
    spec = get_spec(model)
    chosen = resolve_weights(spec, weights, device)
    if not device.startswith("cuda") or chosen not in CARRIED:
        return chosen
    if weights == "random":
        print(f"fastdiff: weights='random' for {spec.key}, as asked: RANDOM WEIGHTS, {NOISE}. "
              f"Carried to the later notebooks ({weights_file()}): their weights='auto' for "
              f"{spec.key} is random too, until a parameters cell asks for "
              f"{checks.arg('weights', 'pretrained')}")
    carry_choice(spec.key, chosen, "asked for by name" if weights != "auto" else "auto: available")
    return chosen
