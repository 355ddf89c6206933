"""Argument checks that run before any slow work: one rule and one wording for each kind of
input (counts, image sizes, numbers, devices, files and folders), so every helper and every
command refuses the same bad input the same way.

Introduced in 00_setup.ipynb. A message names the argument as the user's interface writes it
(arg(); cli.main runs its commands inside `command_line()`) and says what to use instead.
Imports only errors.py (and torch), so every layer of the package can use it.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import numbers
import os
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from .errors import FastdiffError

# inside command_line(): the Python argument names whose flag is another word
_CLI = contextvars.ContextVar("fastdiff_command_line", default=None)
_UNSET = object()


@contextlib.contextmanager
def command_line(names: dict[str, str] | None = None) -> Iterator[None]:
    """Inside: messages name arguments as command-line flags (`--steps 0`); `names` gives the
    flag of an argument whose flag is another word (the command line's own)."""
    token = _CLI.set(dict(names or {}))
    try:
        yield
    finally:
        _CLI.reset(token)


def in_command_line() -> bool:
    """True inside `command_line()`: the user came through the command line."""
    return _CLI.get() is not None


def arg(name: str, value: Any = _UNSET) -> str:
    """Argument `name` (with `value`) as the current interface writes it: `steps=0` in Python,
    `--steps 0` on the command line; without a value `path=` or `--path`."""
    names = _CLI.get()
    if names is not None:
        flag = "--" + names.get(name, name).replace("_", "-")
        return flag if value is _UNSET else f"{flag} {value}"
    return f"{name}=" if value is _UNSET else f"{name}={value!r}"


def whole(name: str, value: Any, minimum: int = 1, none: bool = False) -> int | None:
    """A whole number >= minimum (None allowed when `none`: the helper's default)."""
    if value is None and none:
        return None
    if (isinstance(value, bool) or not isinstance(value, numbers.Integral)
            or value < minimum):
        default = " (or leave it out for the default)" if none else ""
        raise FastdiffError(f"{arg(name, value)} cannot work: give a whole number of at least "
                            f"{minimum}{default}.")
    return int(value)


SWITCH_ON, SWITCH_OFF = ("1", "true", "yes"), ("0", "false", "no")
_SAID: set[tuple[str, str]] = set()  # the unknown switch values already said, once each


def env_switch(variable: str, what: str, on: tuple[str, ...] = SWITCH_ON) -> bool:
    """An on/off environment variable: on for 1, true or yes (or `on`, a library's values), off
    unset or for 0, false or no (any case); another value is off, said once with the values."""
    raw = os.environ.get(variable, "")
    value = raw.strip().lower()
    if value and value not in on + SWITCH_OFF and (variable, value) not in _SAID:
        _SAID.add((variable, value))
        print(f"fastdiff: {variable}={raw!r} is not a value it takes: {what} stays off; "
              f"{', '.join(on)} switch it on, {', '.join(SWITCH_OFF)} (or unset) leave "
              "it off")
    return value in on


def image_size(name: str, value: Any, multiple: int) -> int | None:
    """None (the model's size) or a positive multiple of `multiple` pixels."""
    if value is None:
        return None
    whole(name, value, 1)
    if value % multiple:
        lower, upper = max(value - value % multiple, multiple), value - value % multiple + multiple
        near = f"{lower} or {upper}" if lower != upper else f"{upper}"
        raise FastdiffError(f"{arg(name, value)} cannot work: this model needs a multiple of "
                            f"{multiple} pixels (its latent grid), e.g. {near}.")
    return int(value)


def call_size(steps: Any, height: Any, width: Any, multiple: int) -> None:
    """A call's steps and its height and width (image_size), each None for the model's own."""
    whole("steps", steps, 1, none=True)
    for name, value in (("height", height), ("width", width)):
        image_size(name, value, multiple)


def real(name: str, value: Any, none: bool = False) -> float | None:
    """A finite number (None allowed when `none`)."""
    if value is None and none:
        return None
    if (isinstance(value, bool) or not isinstance(value, numbers.Real)
            or not math.isfinite(value)):
        raise FastdiffError(f"{arg(name, value)} cannot work: give a finite number.")
    return float(value)


def text(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise FastdiffError(f"{arg(name, value)} cannot work: give a string.")
    return value


def device(value: Any, name: str = "device", meta: bool = False) -> str:
    """A device this machine has: 'cpu', 'cuda', 'cuda:N' (N below the GPU count), 'mps'
    where available, and 'meta' where `meta` (building without memory)."""
    try:
        parsed = torch.device(value)
    except (RuntimeError, TypeError, ValueError):
        raise FastdiffError(f"{arg(name, value)} is not a device: use 'cpu', 'cuda' or "
                            "'cuda:N'.") from None
    if parsed.type not in ("cpu", "cuda", "mps", "meta"):
        raise FastdiffError(f"{arg(name, value)}: the course runs on 'cpu', 'cuda' or 'mps'.")
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise FastdiffError(f"{arg(name, value)} but this machine has no CUDA GPU: use "
                                f"{arg(name, 'cpu')} (with {arg('weights', 'tiny')} for a "
                                "quick run).")
        if parsed.index is not None and parsed.index >= count:
            raise FastdiffError(f"{arg(name, value)} but this machine has {count} GPU(s): use "
                                f"cuda:0 to cuda:{count - 1}.")
    elif parsed.type == "mps" and not torch.backends.mps.is_available():
        raise FastdiffError(f"{arg(name, value)} but this machine has no MPS device: use "
                            f"{arg(name, 'cpu')}.")
    elif parsed.type == "meta" and not meta:
        raise FastdiffError(f"{arg(name, value)} holds no data and cannot run: use 'cpu' "
                            "or 'cuda' (the meta device only builds the architecture, "
                            "in fdh.load_pipeline(weights='random')).")
    return str(value)


def pathlike(name: str, value: Any) -> Path:
    if not isinstance(value, (str, os.PathLike)) or not str(value):
        raise FastdiffError(f"{arg(name, value)} cannot work: give a path.")
    return Path(value)


def existing(name: str, value: Any, what: str, folder: bool = False) -> Path:
    """A file (with `folder`, a folder) that exists; `what` says what it should be (in the
    message)."""
    path = pathlike(name, value)
    if not (path.is_dir() if folder else path.is_file()):
        state = ("is a " + ("file" if folder else "folder")) if path.exists() else "does not exist"
        raise FastdiffError(f"{arg(name, str(path))}: {path} {state}; give {what}.")
    return path


def nearest_existing(path: str | os.PathLike) -> Path:
    """`path`, or its nearest parent that exists."""
    path = Path(path).absolute()
    while not path.exists():
        path = path.parent
    return path


def writable(name: str, path: Path, folder: Path) -> None:
    """`folder` (`path` itself, or the folder `path` goes in) must let this user write in it."""
    if not os.access(folder, os.W_OK | os.X_OK):
        raise FastdiffError(f"{arg(name, str(path))}: {folder} is not writable here; give a "
                            "folder you can write to.")


def writable_parent(name: str, path: Path) -> None:
    """The nearest existing folder above `path` must be a folder this user can write to."""
    above = nearest_existing(path.parent)
    if not above.is_dir():
        raise FastdiffError(f"{arg(name, str(path))}: {above} is a file, so {path} cannot be "
                            "created; give a path under a folder.")
    writable(name, path, above)


def output_file(name: str, value: Any, example: str = "results.jsonl",
                ours: Callable[[Path], bool] | None = None, what: str = "") -> Path:
    """A file to write: not an existing folder, under a folder that exists or can be made.
    With `ours` (is an existing file one this writer made? `what` names such a file), an
    existing file that is not is refused: it is left as it is."""
    path = pathlike(name, value)
    if path.is_dir():
        raise FastdiffError(f"{arg(name, str(path))}: {path} is a folder; give a file name, "
                            f"e.g. {path / example}.")
    if not path.exists():
        writable_parent(name, path)
    elif ours is not None and not ours(path):
        raise FastdiffError(f"{arg(name, str(path))}: {path} exists and is not {what}, so it "
                            "is left as it is; give a new file name, or move that file away.")
    return path


def file_starts(path: Path, first: bytes, *within: bytes, size: int = 4096) -> bool:
    """Whether a file begins with `first` (leading whitespace aside) and holds each of `within`
    in its first `size` bytes: how a writer knows a file of its own kind before replacing it."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(size)
    except OSError:
        return False
    return head.lstrip().startswith(first) and all(marker in head for marker in within)
