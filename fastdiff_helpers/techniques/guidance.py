"""Classifier-free guidance stopped after a share of the steps: the rest run at batch 1.

Introduced in 09_fewer_denoiser_calls.ipynb. SD1.5, SDXL and SSD-1B: diffusers' own callbacks
(diffusers/callbacks.py: SDCFGCutoffCallback, SDXLCFGCutoffCallback), passed on every call as
callback_on_step_end; at the end of the cut-off step they keep the conditional half of the
prompt embeddings (and SDXL's pooled embeddings and time ids) and set the pipeline's
_guidance_scale to 0.0 (callbacks.py:92, 131: the callback's own code, the pipelines offer no
public setter), so the pipeline stops doubling the batch. PixArt-alpha's pipeline takes no
callback_on_step_end (only the legacy `callback`, pipeline_pixart_alpha.py:708) and keeps
guidance in a local variable (:839), so there it is done by hand at the denoiser: its
StepPlan runs the conditional half alone and hands it back twice, which the pipeline's guidance
turns into the conditional prediction itself (uncond + g * (cond - uncond) with uncond = cond).
"""

from __future__ import annotations

from typing import Any

from ..models.loading import family_of, get_denoiser, pipeline_info
from ._state import record, refuse_after
from .flux import refuse
from .recipe import RecipeError
from .step_cache import StepPlan, guided_steps, step_plan


def cutoff_share(callback: Any, steps: int, calls: int) -> float | None:
    """The guidance stop a diffusers CFG cut-off callback (SDCFGCutoffCallback,
    SDXLCFGCutoffCallback) makes on a call of `steps` inference steps and `calls` denoiser calls,
    as stop_guidance's share (guided_steps(steps, share) is the steps it keeps guided), for
    fdh.benchmark's FLOP count and record; None for another callback, or one that cuts only
    after the last call. The callback drops the unconditional half after step index
    `cutoff_step_index`, else int(calls * cutoff_step_ratio) (diffusers/callbacks.py)."""
    from diffusers.callbacks import SDCFGCutoffCallback, SDXLCFGCutoffCallback

    if not isinstance(callback, (SDCFGCutoffCallback, SDXLCFGCutoffCallback)):
        return None
    index = callback.config.cutoff_step_index
    if index is None:
        index = int(calls * callback.config.cutoff_step_ratio)
    if index < 0 or index + 1 >= calls:
        return None
    return (index + 1) / steps


def stop_guidance(pipe, share: float = 0.5):
    """Classifier-free guidance on the first `share` of the steps only (rounded up: 0.5 of 30
    steps guides 15), at batch 2; the other steps run the conditional prompt alone, at batch 1.
    share=1.0 changes nothing. Apply before compile (fdh.apply orders it). On PixArt it acts
    at the transformer, so every call has it; on SD1.5, SDXL and SSD-1B it is diffusers'
    callback, which every call the helpers make gets (fdh.call_kwargs adds it: fdh.generate,
    fdh.benchmark, run_ladder), and a pipe(...) call of your own must pass:
    callback_on_step_end=fdh.call_kwargs(pipe, steps=n)["callback_on_step_end"]; without it
    the call keeps guidance, batch 2, on every step. Compiled, the denoiser sees batch 2 and
    then batch 1 in one call: the first call compiles a second graph at the cut-off step
    (dynamo's guard on the input's size), and later calls reuse both (tests/test_fewer_calls.py).
    Introduced in 09_fewer_denoiser_calls.ipynb."""
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
        raise RecipeError(f"share={share!r}: give the share of the steps that keep guidance, "
                          "above 0 and at most 1 (0.5: the first half).")
    refuse_after(pipe, "stop_guidance", "compile")
    refuse(pipe, "guidance_stop")  # Flux runs no doubled batch to halve
    info = pipeline_info(pipe)
    if "guidance_stop" in info.applied:
        raise RecipeError("Guidance already stops on this pipeline; load a fresh one to change "
                          "where.")
    share = float(share)
    if family_of(pipe) == "transformer":  # PixArt-alpha: no callback (call_kwargs)
        step_plan(pipe, create=True).guidance_stop = share
    else:  # diffusers' own callback, made for each call (call_kwargs)
        from diffusers.callbacks import SDCFGCutoffCallback, SDXLCFGCutoffCallback

        cls = SDXLCFGCutoffCallback if hasattr(pipe, "text_encoder_2") else SDCFGCutoffCallback

        def per_call(kwargs: dict[str, Any]) -> dict[str, Any]:
            steps = kwargs["num_inference_steps"]
            guided = guided_steps(steps, share)
            if guided >= steps or kwargs["guidance_scale"] <= 1:
                return {}
            # the callback runs after step `cutoff`: steps 0..cutoff keep guidance
            return {"callback_on_step_end": cls(cutoff_step_ratio=None,
                                                cutoff_step_index=guided - 1)}
        info.per_call.append(per_call)
    record(pipe, "guidance_stop", share)
    return pipe


def code(r, flux: bool = False, D: str = "denoiser") -> dict[str, list]:
    """The guidance stop as code (fdh.to_code): diffusers' own callback on the SD models, the
    helper on PixArt."""
    return {"guidance_stop": [
        "# guidance on the first share of the steps",
        "import math",
        f"guided = max(1, math.ceil(num_inference_steps * {r.guidance_stop!r} - 1e-9))",
        "if hasattr(pipe, 'unet'):  # diffusers' own callback, passed on each call",
        "    from diffusers.callbacks import SDCFGCutoffCallback, SDXLCFGCutoffCallback",
        "    Cutoff = SDXLCFGCutoffCallback if hasattr(pipe, 'text_encoder_2') else "
        "SDCFGCutoffCallback",
        "    callback = Cutoff(cutoff_step_ratio=None, cutoff_step_index=guided - 1)",
        "    # pipe(prompt, num_inference_steps=num_inference_steps, "
        "callback_on_step_end=callback)",
        "else:  # PixArt's pipeline takes no callback_on_step_end: the course's helper",
        "    import fastdiff_helpers as fdh",
        f"    fdh.stop_guidance(pipe, {r.guidance_stop!r})"]}


def read(pipe, done: dict[str, Any]) -> dict[str, Any]:
    """Where guidance stops (fdh.current_recipe): PixArt's step plan; on the SD models the
    callback stop_guidance adds to every call, as it recorded it (a callback a call of your own
    passes is the call's: fdh.benchmark reads it, cutoff_share)."""
    plan = vars(get_denoiser(pipe)).get("forward")
    if isinstance(plan, StepPlan) and plan.guidance_stop is not None:
        return {"guidance_stop": plan.guidance_stop}
    return {"guidance_stop": done.get("guidance_stop")}
