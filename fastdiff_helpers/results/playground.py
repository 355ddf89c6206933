"""playground(): an ipywidgets panel to try recipes on a model and compare the runs.

Introduced in 10_playground.ipynb. It only composes the public API (load_pipeline, apply,
benchmark, compare_images, ladder_chart, to_code: its box shows the recipe as plain diffusers,
torch and torchao code, what a participant copies); every run loads a fresh pipeline,
because a pipeline takes one recipe. ipywidgets is imported only when a panel is built.
The course hooks in through one argument, `settings` (fdh.course.settings(...)): the panel's
defaults, smoke mode's run count and the autotune decision passed to fdh.apply.

Its vocabulary comes first: its controls (one per Recipe field, with readable labels and
choices), its phases, and the small formatters its table and images use.
"""

from __future__ import annotations

import base64
import html
import io
import threading
import time
import warnings
from typing import Any, Callable

import torch

from .. import checks
from ..models.loading import default_device, free_memory, load_pipeline
from ..models.presets import MODELS, SCHEDULERS, get_spec
from ..models.pretrained import check_weights
from ..techniques import apply
from ..techniques.codegen import to_code
from ..techniques.recipe import BASELINE, KNOBS, Recipe, RecipeError
from ..techniques.schedulers import set_scheduler
from ..measure.bench import benchmark
from ..measure.quality import compare_images
from ..measure.record import GIB, psnr_text
from .charts import ladder_chart
from .store import Result

__all__ = ["Playground", "playground", "describe_recipe"]

# --- The playground's vocabulary: controls, phases, formatters -----------------------------------

# Recipe field -> readable label (the widget's description; the browser test finds it by it)
LABELS = {name: knob.label for name, knob in KNOBS.items()}
# A Dropdown's value None means "nothing selected", so None/True/False travel as words (a
# field's Knob.unset: "off" or "auto"); a True/False field is a checkbox
_WORDS = {"off": None, "auto": None, "True": True, "False": False}
_CHOICES: dict[str, list] = {
    name: list(knob.widget) or [knob.unset if v is None or v is False else v
                                for v in knob.choices]
    for name, knob in KNOBS.items() if knob.choices != (False, True)}
RESOLUTIONS = [("model default", 0)] + [(f"{n}x{n}", n) for n in (64, 128, 256, 512, 768, 1024)]
_PHASES = ["idle", "loading the pipeline", "applying the recipe",
           "cold start (compiling), warm-up and timing", "comparing with the baseline", "done"]


SCHEDULER_CHOICES = ["own", *SCHEDULERS]  # the pipeline's own, or a swap (fdh.set_scheduler)


def describe_recipe(recipe: Recipe, scheduler: str = "own") -> str:
    """A short label: the dtype, then every field that differs from the fp32 baseline, and a
    scheduler swap."""
    parts = [recipe.dtype] + ([] if scheduler == "own" else [f"scheduler={scheduler}"])
    for name in recipe.changes(BASELINE):
        value = getattr(recipe, name)
        if name == "dtype":
            continue
        if isinstance(value, bool):
            parts.append(LABELS[name] if value else f"no {LABELS[name]}")
        else:
            parts.append(f"{LABELS[name]}={'off' if value is None else value}")
    return ", ".join(parts)


CODE_HEAD = "# on `pipe`, a diffusers pipeline as from_pretrained loads it (fp32)\n"
NOTHING_TO_ADD = "# nothing to add: a diffusers pipeline loaded in fp32 runs this recipe as it is\n"


def recipe_code(recipe: Recipe, model: str, scheduler: str = "own",
                notes: list[str] | tuple[str, ...] = ()) -> str:
    """What the panel's "recipe as code" box holds, for a participant to copy: the notes as
    comments, then the technique alone in plain diffusers / torch / torchao code
    (fdh.to_code(recipe, "plain", model=model)) and the scheduler swap, if any. Raises
    RecipeError where the recipe cannot be written for `model` (as fdh.apply refuses it)."""
    code = to_code(recipe, "plain", model=model).strip()
    if scheduler != "own":  # what fdh.set_scheduler does (09_fewer_denoiser_calls)
        swap = (f"from diffusers import {SCHEDULERS[scheduler]}\n"
                f"pipe.scheduler = {SCHEDULERS[scheduler]}.from_config(pipe.scheduler.config)")
        code = f"{code}\n\n{swap}" if code else swap
    body = CODE_HEAD + code + "\n" if code else NOTHING_TO_ADD
    return "".join(f"# {n}\n" for n in notes) + body


def _png(image_or_figure: Any) -> bytes:
    buf = io.BytesIO()
    if hasattr(image_or_figure, "savefig"):
        image_or_figure.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    else:
        image_or_figure.save(buf, format="PNG")
    return buf.getvalue()


def _fmt(value: float | None, pattern: str) -> str:
    return "-" if value is None else pattern.format(value)


# --- playground(): the panel ---------------------------------------------------------------------

class Playground:
    """The panel returned by fdh.playground(); display it (or `.widget`) in a notebook.

    Attributes for scripts and tests: `controls` (name -> widget: model, steps, resolution,
    runs, warmup and one per Recipe field), `run_button`, `reset_button`, `progress`,
    `status`, `table` (HTML), `rows` (the Results, in order), `chart` (Output), `code`
    (Textarea), `error` (HTML), `notes` (HTML), `log` (Output), `images` (baseline, last).
    `run()` is what the Run button calls. Introduced in 10_playground.ipynb."""

    def __init__(self, model: str | None = None, weights: str | None = None,
                 device: str | None = None, settings: Any = None) -> None:
        try:
            import ipywidgets as W
        except ImportError:
            raise ImportError("fdh.playground() needs ipywidgets: pip install ipywidgets "
                              "(and jupyterlab to display it).") from None
        weights = weights or (settings.weights if settings else "auto")
        check_weights(weights)
        if device is not None:
            checks.device(device)
        spec = get_spec(model or (settings.model if settings else "sdxl"))  # refuses a typo
        self.weights, self.device = weights, device or (settings.device if settings
                                                        else default_device())
        self.smoke = bool(settings and settings.smoke)
        self.tuning = settings.tuning if settings else None  # the course's autotune decision
        self.rows: list[Result] = []
        self.baselines: dict[tuple, Result] = {}
        wide = {"description_width": "initial"}

        def dropdown(label: str, options: list, value: Any) -> Any:
            return W.Dropdown(options=options, value=value, description=label, style=wide,
                              layout=W.Layout(width="auto"))

        def number(label: str, value: int, lo: int, hi: int) -> Any:
            return W.BoundedIntText(value=value, min=lo, max=hi, description=label,
                                    style=wide, layout=W.Layout(width="150px"))

        self.controls: dict[str, Any] = {
            "model": dropdown("model", [(f"{k}: {s.name}", k) for k, s in MODELS.items()],
                              spec.key),
            "steps": number("steps", settings.steps if settings else spec.steps, 1, 200),
            "resolution": dropdown("resolution", RESOLUTIONS, 0),
            # fdh.benchmark's own runs and warm-up, where no course settings say otherwise
            "runs": number("timed runs", settings.runs if settings else 5, 1, 50),
            "warmup": number("warm-up", settings.warmup if settings else 2, 0, 10),
            "scheduler": dropdown("scheduler", SCHEDULER_CHOICES, "own")}
        # the default recipe is fp32, or the course's baseline on this card (settings.baseline):
        # the card's half precision where the model's fp32 does not fit (SDXL on a T4)
        baseline = settings.baseline if settings else BASELINE
        for name, label in LABELS.items():
            default = getattr(baseline, name)
            self.controls[name] = (
                W.Checkbox(value=default, description=label, indent=False,
                           layout=W.Layout(width="auto", margin="0 12px 0 0"))
                if name not in _CHOICES else
                dropdown(label, _CHOICES[name], _CHOICES[name][0] if default in (None, False)
                         else default))
        self.run_button = W.Button(description="Run", button_style="primary")  # no icon: its
        # glyph would become part of the accessible name (" Run")
        self.reset_button = W.Button(description="Reset")
        self.progress = W.IntProgress(value=0, min=0, max=len(_PHASES) - 1,
                                      description="progress", style=wide)
        self.status = W.Label(value="idle")
        self._phase_started = (0, time.monotonic())  # (phase, since): what the ticker shows
        self.error = W.HTML(value="")
        self.notes = W.HTML(value="")
        self.log = W.Output(layout=W.Layout(max_height="120px", overflow="auto"))
        self.code = W.Textarea(value="", description="recipe as code (copy it)", style=wide,
                               layout=W.Layout(width="100%", height="150px"))
        self.table = W.HTML(value="")
        self.chart = W.Output(layout=W.Layout(min_width="420px"))
        self.images = (W.Image(format="png", layout=W.Layout(width="192px")),
                       W.Image(format="png", layout=W.Layout(width="192px")))
        self.captions = (W.HTML("baseline image"), W.HTML("last image"))

        self.run_button.on_click(self.run)
        self.reset_button.on_click(self.reset)
        for widget in self.controls.values():
            widget.observe(self._refresh_code, names="value")
        c, row = self.controls, lambda *ws: W.HBox(list(ws), layout=W.Layout(flex_flow="row wrap"))
        boxes = [c[n] for n in LABELS if isinstance(c[n], W.Checkbox)]
        self.widget = W.VBox([
            W.HTML("<b>fastdiff playground</b>: pick a model and a recipe, press <b>Run</b>. "
                   "The first run of a model (at a given size and steps) is its "
                   "<b>baseline</b>: later runs show their speed-up and PSNR against it. "
                   f"Device: <code>{html.escape(self.device)}</code>, weights: "
                   f"<code>{html.escape(weights)}</code>."),
            row(c["model"], c["steps"], c["resolution"], c["runs"], c["warmup"], c["scheduler"]),
            row(*[c[n] for n in LABELS if c[n] not in boxes]), row(*boxes),
            row(self.run_button, self.reset_button, self.progress, self.status),
            self.error, self.notes, self.log, self.code, self.table,
            W.HBox([self.chart,
                    W.VBox([self.captions[0], self.images[0]]),
                    W.VBox([self.captions[1], self.images[1]])])])
        self.widget.add_class("fastdiff-playground")  # a handle for browser tests and CSS
        self._refresh_code()
        self._render()

    # -- what the controls say -----------------------------------------------------------

    def recipe(self) -> tuple[Recipe, list[str]]:
        """The recipe the controls describe, adapted to this device (Recipe.for_device),
        with a note for each adaptation. Raises RecipeError for an invalid combination."""
        values = {name: self.controls[name].value for name in LABELS}
        chosen = Recipe(**{name: _WORDS.get(v, v) if name in _CHOICES else v
                           for name, v in values.items()})
        recipe, notes = chosen.for_device(self.device)
        recipe.check_device(self.device)
        return recipe, notes

    def _refresh_code(self, change: Any = None) -> None:
        try:
            recipe, notes = self.recipe()
            code = recipe_code(recipe, self.controls["model"].value,
                               self.controls["scheduler"].value, notes)
        except RecipeError as exc:
            self.code.value = f"# Invalid recipe: {exc}"
            self.notes.value = ""
            return
        self.code.value = code
        self.notes.value = "".join(f"<div>Note: {html.escape(n)}</div>" for n in notes)

    # -- running -------------------------------------------------------------------------

    def max_runs(self, runs: int) -> int | None:
        """As fdh.course.settings: smoke mode times `runs` calls, else benchmark's default."""
        return runs if self.smoke else None

    def _phase(self, index: int) -> None:
        self.progress.value, self.status.value = index, _PHASES[index]
        self._phase_started = (index, time.monotonic())

    def _tick(self, stop: threading.Event) -> None:
        """Every second while a run is busy: the current phase and how long it has taken, so a
        compile that runs for minutes shows life."""
        while not stop.wait(1.0):
            index, started = self._phase_started
            if 0 < index < len(_PHASES) - 1:
                self.status.value = f"{_PHASES[index]}: {time.monotonic() - started:.0f} s"

    def _in_log(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        # An Output context in a kernel swallows exceptions (it shows them itself), so catch
        # inside and raise outside: the panel's own error area reports them.
        caught: list[BaseException] = []
        with self.log:
            try:
                return fn(*args, **kwargs)
            except BaseException as exc:  # re-raised just below, outside the Output
                caught.append(exc)
        raise caught[0]

    def run(self, button: Any = None) -> Result | None:
        """Load a fresh pipeline, apply the recipe, benchmark it and add a row; what the Run
        button calls. Errors are shown in `error` and return None; the panel keeps working."""
        self.error.value, self.log.outputs = "", ()
        self.run_button.disabled = True
        self.progress.bar_style = ""
        pipe, stop = None, threading.Event()
        threading.Thread(target=self._tick, args=(stop,), daemon=True).start()
        try:
            recipe, notes = self.recipe()
            c = self.controls
            self._phase(1)
            # the weights in the dtype the recipe runs in, as the notebooks load a rung: bf16
            # or fp16 files, not fp32 ones cast (SDXL's fp32 does not fit a T4)
            pipe = self._in_log(load_pipeline, c["model"].value, weights=self.weights,
                                device=self.device, dtype=recipe.weight_dtype)
            if c["scheduler"].value != "own":  # 09_fewer_denoiser_calls: steps vs solver
                set_scheduler(pipe, c["scheduler"].value)
            self._phase(2)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                apply(pipe, recipe, tuning=self.tuning)
            notes += [str(w.message) for w in caught]
            self._phase(3)
            size = c["resolution"].value or None  # 0: the model's default
            result = self._in_log(benchmark, pipe, steps=c["steps"].value, height=size,
                                  width=size, runs=c["runs"].value, warmup=c["warmup"].value,
                                  max_runs=self.max_runs(c["runs"].value),
                                  step=describe_recipe(recipe, c["scheduler"].value))
            self._phase(4)
            self._add(result, notes)
            self._phase(5)
            return result
        except RecipeError as exc:
            self._fail("Invalid recipe", exc, "change the controls named above and run again.")
        except torch.OutOfMemoryError as exc:
            self._fail("Out of memory", exc, "try a lower resolution, bf16 or int8 "
                       "quantization, or restart the kernel to free memory.")
        except Exception as exc:  # compile failures and the like: report, keep the panel
            self._fail(f"Run failed ({type(exc).__name__})", exc, "if it failed while "
                       "compiling, try compile 'off' or 'default', or without fullgraph.")
        finally:
            stop.set()
            del pipe
            free_memory()  # each run compiles a fresh pipeline: release the last one's caches
            self.run_button.disabled = False
        return None

    def _fail(self, title: str, exc: BaseException, hint: str) -> None:
        self._phase_started = (0, time.monotonic())  # the ticker stops writing
        self.progress.value, self.status.value = 0, "failed"
        self.progress.bar_style = "danger"
        self.error.value = (f"<div style='color:#b00020'><b>{html.escape(title)}:</b> "
                            f"{html.escape(str(exc))}<br>Next: {html.escape(hint)}</div>")

    def _add(self, result: Result, notes: list[str]) -> None:
        key = (result.model, result.weights, result.height, result.width, result.steps)
        baseline = self.baselines.setdefault(key, result)
        if baseline is not result:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                result.quality = compare_images(result.image, baseline.image)
            notes += [str(w.message) for w in caught]
        result.notes += notes
        self.rows.append(result)
        self._render()

    def reset(self, button: Any = None) -> None:
        """Forget every run and baseline (what the Reset button calls)."""
        self.rows.clear()
        self.baselines.clear()
        self.error.value, self.log.outputs = "", ()
        self._phase(0)
        self._render()

    # -- showing -------------------------------------------------------------------------

    def _baseline_of(self, r: Result) -> Result:
        return self.baselines[(r.model, r.weights, r.height, r.width, r.steps)]

    def _render(self) -> None:
        self.table.value = self._table_html()
        if not self.rows:
            self.chart.outputs = ()
            for image, caption, text in zip(self.images, self.captions,
                                            ("baseline image", "last image")):
                image.value, caption.value = b"", text
                image.layout.visibility = "hidden"  # an empty image shows a broken icon
            return
        last = self.rows[-1]
        baseline = self._baseline_of(last)
        group = [r for r in self.rows if self._baseline_of(r) is baseline]
        png = _png(ladder_chart(group, title=f"{last.model}: speed-up vs its baseline "
                                             f"({last.height}x{last.width}, {last.steps} steps)"))
        self.chart.outputs = ({"output_type": "display_data", "metadata": {},
                               "data": {"image/png": base64.b64encode(png).decode("ascii"),
                                        "text/plain": "<speed-up chart>"}},)
        self.images[0].value, self.images[1].value = _png(baseline.image), _png(last.image)
        for image in self.images:
            image.layout.visibility = "visible"
        self.captions[0].value = f"baseline: {html.escape(baseline.step)}<br>(PSNR reference)"
        self.captions[1].value = (f"last: {html.escape(last.step)}<br>PSNR vs baseline: "
                                  f"{psnr_text(last.quality) if last is not baseline else 'baseline'}")

    def _table_html(self) -> str:
        head = ["#", "model", "recipe", "size, steps", "seconds (median)", "speed-up",
                "peak memory", "PSNR vs baseline", "cold start"]
        cells = "".join(f"<th style='padding:2px 8px;text-align:left'>{h}</th>" for h in head)
        body = []
        for i, r in enumerate(self.rows, 1):
            base = self._baseline_of(r)
            is_base = base is r
            speedup = "1.00x (baseline)" if is_base else _fmt(
                base.latency_s / r.latency_s if r.latency_s else None, "{:.2f}x")
            kind = "RSS" if r.peak_memory_kind == "process_peak_rss" else "CUDA allocated"
            memory = _fmt(r.peak_memory_bytes and r.peak_memory_bytes / GIB, "{:.2f} GiB " + kind)
            if r.peak_reserved_bytes is not None:  # CUDA-graph pools show only here
                memory += f", {r.peak_reserved_bytes / GIB:.2f} GiB reserved"
            seconds = _fmt(r.latency_s, "{:.3f} s") + "".join(f" ({f}!)" for f in r.flags)
            row = [str(i), r.model, r.step, f"{r.height}x{r.width}, {r.steps}",
                   seconds, speedup, memory,
                   "baseline" if is_base else psnr_text(r.quality), _fmt(r.cold_start_s, "{:.2f} s")]
            body.append("<tr>" + "".join(f"<td style='padding:2px 8px'>{html.escape(v)}</td>"
                                         for v in row) + "</tr>")
        empty = "" if body else "<div>No runs yet: press Run (the first run is the baseline)</div>"
        return (f"<table class='fastdiff-results'><thead><tr>{cells}</tr></thead>"
                f"<tbody>{''.join(body)}</tbody></table>{empty}")

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)


def playground(model: str | None = None, weights: str | None = None,
               device: str | None = None, settings: Any = None) -> Playground:
    """An ipywidgets panel over the helpers' API: choose a model and a recipe, run it, and
    watch the table, speed-up chart, images (with PSNR) and the recipe as code grow.

    model: the initially selected model; weights: as in fdh.load_pipeline; device: "cuda"
    where there is one. settings: the course's hook, what its parameters cell returns
    (fdh.course.settings(...)): model, weights, device, steps, runs, warm-up and the baseline
    recipe by default, smoke mode's timed runs, and its autotune decision passed to fdh.apply.
    Without it: sdxl, "auto" weights, the model's own steps, fdh.benchmark's runs and
    warm-up, the fp32 baseline, and compiles as the recipe says.
    Introduced in 10_playground.ipynb."""
    return Playground(model, weights, device, settings)
