"""fdh.to_code(recipe): the surgery as source to paste into your own notebook.

The plain pieces that have no library equivalent (a backend-pinned SDPA processor, the 1x1-conv
swap, the quantization filter, the sync removal) are emitted from the helpers' own source with
inspect, so plain code and helpers cannot drift apart. Tests execute both flavours against
apply()."""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from typing import Sequence

from ..models.presets import get_spec
from . import STEPS, flux as flux_rules
from .recipe import Recipe, RecipeError

_DENOISER = 'denoiser = pipe.unet if hasattr(pipe, "unet") else pipe.transformer'


def _source(o) -> str:
    """The source of `o` with the docstring of every function and class in it removed: pasted
    code stays short, and the why is in the course's text and in the helpers' own docstrings."""
    source = textwrap.dedent(inspect.getsource(o))
    lines = source.splitlines()
    drop: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                and ast.get_docstring(node) is not None):
            first = node.body[0]
            drop.update(range(first.lineno - 1, first.end_lineno))
            if first.end_lineno < len(lines) and not lines[first.end_lineno].strip():
                drop.add(first.end_lineno)  # the blank line after it
    return "\n".join(line for i, line in enumerate(lines) if i not in drop).rstrip() + "\n"


SECTIONS = tuple(name for step in STEPS for name in step.sections)


def to_code(recipe: Recipe, flavour: str = "fdh", only: str | Sequence[str] | None = None,
            model: str | None = None) -> str:
    """Python source that applies `recipe` to a loaded `pipe`: flavour "fdh", one
    fastdiff_helpers call per technique; "plain", only diffusers, torch and torchao.
    `only` (plain only) keeps the named sections of SECTIONS, e.g. only="compile": the
    technique's own lines, as a notebook shows them. `model`: the code for that model where
    it differs (Flux's attention; what cannot apply to Flux is refused as fdh.apply refuses
    it); None: the blog's four. Introduced in 04_torch_compile.ipynb."""
    if flavour not in ("fdh", "plain"):
        raise RecipeError(f"Unknown flavour {flavour!r}: use 'fdh' or 'plain'.")
    flux = model is not None and get_spec(model).family == "flux"
    if flux and flux_rules.refused(recipe):
        raise RecipeError(flux_rules.REFUSED[flux_rules.refused(recipe)[0]])
    if callable(recipe.quant_filter):
        raise RecipeError("A callable quant_filter cannot be written as code: paste your "
                          "function and pass it as quant_filter= / filter_fn= yourself.")
    if flavour == "fdh":
        if only is not None:
            raise RecipeError("only= picks sections of the plain code: use flavour='plain'.")
        calls = [line for step in STEPS if step.on(recipe) for line in step.fdh(recipe)]
        return "\n".join(["import fastdiff_helpers as fdh", "", *calls]).rstrip() + "\n"
    part = "denoiser" if model is None else (
        "pipe.unet" if get_spec(model).family == "unet" else "pipe.transformer")
    # each step's own `code`, its functions as their source
    sections = {name: [line if isinstance(line, str) else _source(line) for line in lines]
                for step in STEPS if step.on(recipe)
                for name, lines in step.code(recipe, flux, part).items()}
    wanted = list(SECTIONS) if only is None else [only] if isinstance(only, str) else list(only)
    unknown = [name for name in wanted if name not in SECTIONS]
    if unknown:
        raise RecipeError(f"Unknown section(s) {unknown}: use {', '.join(SECTIONS)}.")
    missing = [name for name in wanted if name not in sections]
    if only is not None and missing:
        raise RecipeError(f"This recipe has no {', '.join(missing)} step: its sections are "
                          f"{', '.join(sections)}.")
    text = "\n\n".join("\n".join(sections[name]).rstrip() for name in SECTIONS
                       if name in wanted and name in sections)
    head = ["import torch"] if re.search(r"\btorch\.", text) else []
    if part == "denoiser" and re.search(r"(?<![\w(])denoiser[.,)]", text):
        head.append(_DENOISER)
    return "\n\n".join(head + ([text] if text else [])) + "\n"
