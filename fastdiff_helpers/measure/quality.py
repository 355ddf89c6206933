"""Image quality. Introduced in 01_baseline.ipynb: every faster step is compared with the
fp32 baseline's image, so a speed-up is always shown next to what it cost in output quality.

SSIM is written here (about 20 lines) because neither torch nor diffusers ships one and we
avoid a scikit-image dependency for a single function.
"""

from __future__ import annotations

import functools
import math
import warnings
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["compare_images", "image_to_array", "NonFiniteImageWarning"]

class NonFiniteImageWarning(UserWarning):
    """Warned by compare_images() when an image holds NaN or inf values."""


def image_to_array(image: Any) -> np.ndarray:
    """Convert an image to a float64 HWC numpy array in [0, 1].

    Accepts a PIL image (mode L or RGB; other modes are converted to RGB), a numpy array
    (HW, HWC or NHWC with N=1; uint8/uint16 are scaled, floats are taken as [0, 1]), a torch
    tensor (CHW, HWC or NCHW with N=1, floats in [0, 1], any dtype incl. bf16), or a list
    holding one image (a pipeline's ``.images``). An alpha channel is dropped.

    NaN/inf survive the conversion, so they can be detected. Note that detection only means
    something for float arrays/tensors: a PIL or uint8 image decoded from NaN latents has
    already turned NaN into 0 (a black image) and looks finite here. Ask the pipeline for
    ``output_type="np"`` or ``"pt"`` to check for NaN.

    Introduced in 01_baseline.ipynb.
    """
    if isinstance(image, (list, tuple)):
        if len(image) != 1:
            raise ValueError(
                f"got a list of {len(image)} images; pass one image, e.g. result.images[0]"
            )
        image = image[0]

    channels_first = torch.is_tensor(image)
    if channels_first:
        t = image.detach().to("cpu")
        arr = t.float().numpy().astype(np.float64) if t.is_floating_point() else t.numpy()
    elif hasattr(image, "mode") and hasattr(image, "size") and hasattr(image, "convert"):
        if image.mode not in ("L", "RGB", "F"):
            image = image.convert("RGB")
        arr = np.asarray(image)
    elif isinstance(image, np.ndarray):
        arr = image
    else:
        raise TypeError(
            f"cannot read an image from {type(image).__name__}; pass a PIL image, "
            "a numpy array (HWC) or a torch tensor (CHW/NCHW)"
        )

    if arr.ndim == 4:
        if arr.shape[0] != 1:
            raise ValueError(f"got a batch of {arr.shape[0]} images {arr.shape}; pass one, e.g. x[0]")
        arr = arr[0]
    if channels_first and arr.ndim == 3 and arr.shape[0] in (1, 3, 4):
        arr = arr.transpose(1, 2, 0)  # CHW -> HWC (torch's convention wins when ambiguous)
    if arr.ndim == 2:
        arr = arr[:, :, None]
    if arr.ndim != 3 or arr.shape[-1] not in (1, 3, 4):
        raise ValueError(f"expected an image shaped HxWxC with C in (1, 3, 4), got shape {arr.shape}")
    if arr.shape[-1] == 4:
        arr = arr[:, :, :3]

    if arr.dtype in (np.uint8, np.uint16):
        return arr.astype(np.float64) / np.iinfo(arr.dtype).max
    if np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"integer images must be uint8 or uint16, got {arr.dtype}; convert to float in [0, 1]")
    return arr.astype(np.float64)


def _ssim(a: np.ndarray, b: np.ndarray, data_range: float = 1.0) -> float:
    """Mean SSIM (Wang et al. 2004): 11x11 Gaussian window, sigma 1.5, valid region, per channel."""
    h, w = a.shape[:2]
    size = min(11, h, w)
    size -= 1 - size % 2  # odd window; shrunk only for images smaller than 11 px
    sigma = 1.5 * size / 11.0
    g = np.exp(-((np.arange(size, dtype=np.float64) - (size - 1) / 2.0) ** 2) / (2.0 * sigma**2))
    g = g / g.sum()
    kernel = torch.from_numpy(np.outer(g, g))[None, None]  # 1x1xKxK, float64

    x = torch.from_numpy(np.ascontiguousarray(a.transpose(2, 0, 1)))[:, None]  # C x 1 x H x W
    y = torch.from_numpy(np.ascontiguousarray(b.transpose(2, 0, 1)))[:, None]
    blur = functools.partial(F.conv2d, weight=kernel)

    c1 = (0.01 * data_range) ** 2
    c2 = (0.03 * data_range) ** 2
    mu_x, mu_y = blur(x), blur(y)
    sxx = blur(x * x) - mu_x**2
    syy = blur(y * y) - mu_y**2
    sxy = blur(x * y) - mu_x * mu_y
    num = (2 * mu_x * mu_y + c1) * (2 * sxy + c2)
    den = (mu_x**2 + mu_y**2 + c1) * (sxx + syy + c2)
    per_channel = (num / den).mean(dim=(1, 2, 3))
    return float(per_channel.mean())


def compare_images(image: Any, reference: Any) -> dict[str, Any]:
    """Compare an image with a reference (usually the fp32 baseline's image).

    Returns ``{"psnr", "ssim", "max_abs", "nan", "nonfinite_fraction"}``:

    - psnr: dB with data range 1 (``math.inf`` when identical). No threshold of "looks the
      same" is measured here: on tiny or random weights it shows how far numbers moved.
    - ssim: mean SSIM, Gaussian window, averaged over channels; 1.0 when identical.
    - max_abs: largest absolute difference of one pixel value, in [0, 1] units.
    - nan: True if either image holds NaN or inf (then psnr, ssim, max_abs are NaN and a
      NonFiniteImageWarning names the usual cause, the fp16 SDXL VAE).
    - nonfinite_fraction: share of pixel values that are NaN/inf in either image.

    Inputs are anything image_to_array() reads; both must have the same shape.

    Introduced in 01_baseline.ipynb.
    """
    a = image_to_array(image)
    b = image_to_array(reference)
    if a.shape != b.shape:
        raise ValueError(
            f"image shape {a.shape} differs from reference shape {b.shape} (HWC); "
            "generate both at the same height/width, or resize one before comparing"
        )

    bad_a = ~np.isfinite(a)
    bad_b = ~np.isfinite(b)
    bad = bad_a | bad_b
    nan = bool(bad.any())
    if nan:
        which = " and ".join(
            name for name, m in (("the image", bad_a), ("the reference", bad_b)) if m.any()
        )
        warnings.warn(f"NaN/inf pixels in {which}: the image is broken, not merely different. "
                      "The classic cause is the SDXL VAE overflowing in fp16 (it decodes to NaN, "
                      "which PIL then shows as a black image). Load the fp16-fix VAE "
                      "'madebyollin/sdxl-vae-fp16-fix', or keep the VAE in fp32/bf16 "
                      "(pipe.vae.to(torch.float32) or dtype='bf16').", NonFiniteImageWarning,
                      stacklevel=2)
        psnr = ssim = max_abs = math.nan
    else:
        for name, arr in (("image", a), ("reference", b)):
            if arr.min() < -1e-3 or arr.max() > 1 + 1e-3:
                warnings.warn(
                    f"the {name} has values in [{arr.min():.3f}, {arr.max():.3f}], outside "
                    "[0, 1]; PSNR/SSIM assume [0, 1]. If it is in [-1, 1] (VAE output), pass "
                    "(x + 1) / 2.",
                    stacklevel=2,
                )
        diff = a - b
        mse = float(np.mean(diff * diff))
        psnr = math.inf if mse == 0.0 else 10.0 * math.log10(1.0 / mse)
        ssim = 1.0 if mse == 0.0 else _ssim(a, b)
        max_abs = float(np.max(np.abs(diff)))
    return {
        "psnr": psnr,
        "ssim": ssim,
        "max_abs": max_abs,
        "nan": nan,
        "nonfinite_fraction": float(bad.mean()),
    }
