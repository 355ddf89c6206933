import math
import warnings

import numpy as np
import pytest
import torch
from PIL import Image

from fastdiff_helpers.measure.quality import NonFiniteImageWarning, compare_images, image_to_array


def _image(seed=0, h=64, w=48):
    rng = np.random.default_rng(seed)
    # smooth-ish content in [0, 254] so a +1 offset never clips
    base = rng.integers(0, 255, size=(h // 8, w // 8, 3)).repeat(8, 0).repeat(8, 1)
    return np.clip(base + rng.integers(-10, 10, size=(h, w, 3)), 0, 254).astype(np.uint8)


def test_identical_images():
    img = _image()
    q = compare_images(img, img.copy())
    assert q["psnr"] == math.inf
    assert q["ssim"] == pytest.approx(1.0)
    assert q["max_abs"] == 0.0
    assert q["nan"] is False
    assert q["nonfinite_fraction"] == 0.0


def test_psnr_of_uniform_offset():
    img = _image()
    q = compare_images(img + 1, img)
    assert q["psnr"] == pytest.approx(20 * math.log10(255.0), abs=1e-9)  # 48.13 dB
    assert q["psnr"] == pytest.approx(48.13, abs=0.01)
    assert q["max_abs"] == pytest.approx(1 / 255)
    assert 0.99 < q["ssim"] < 1.0


def test_ssim_identical_vs_negation():
    img = _image(1)
    assert compare_images(img, img)["ssim"] == pytest.approx(1.0)
    # SSIM computed (not short-circuited) for a tiny change is still ~1
    near = img.astype(np.float64) / 255.0
    assert compare_images(near + 1e-9, near)["ssim"] == pytest.approx(1.0, abs=1e-6)
    neg = compare_images(255 - img, img)
    assert neg["ssim"] < 0.2
    assert neg["psnr"] < 10


def test_ssim_matches_reference_formula_on_constant_images():
    # constant images: sigma terms vanish, SSIM = (2ab + c1) / (a^2 + b^2 + c1)
    a, b = 0.6, 0.4
    c1 = 0.01**2
    q = compare_images(np.full((32, 32, 3), a), np.full((32, 32, 3), b))
    assert q["ssim"] == pytest.approx((2 * a * b + c1) / (a * a + b * b + c1), rel=1e-9)
    assert q["psnr"] == pytest.approx(10 * math.log10(1 / 0.04))


def test_inputs_pil_numpy_torch_agree():
    img = _image(2)
    ref = _image(3)
    expected = compare_images(img, ref)
    as_float = img.astype(np.float32) / 255.0
    chw = torch.from_numpy(as_float).permute(2, 0, 1)
    for candidate in (Image.fromarray(img), as_float, chw, chw[None], chw.to(torch.float64),
                      torch.from_numpy(as_float), [Image.fromarray(img)], as_float[None]):
        q = compare_images(candidate, Image.fromarray(ref))
        assert q["psnr"] == pytest.approx(expected["psnr"], rel=1e-5)
        assert q["ssim"] == pytest.approx(expected["ssim"], rel=1e-5)


def test_image_to_array_conventions():
    arr = image_to_array(np.array([[0, 255]], dtype=np.uint8))
    assert arr.shape == (1, 2, 1) and arr.dtype == np.float64
    assert arr[0, 1, 0] == 1.0
    rgba = image_to_array(Image.new("RGBA", (4, 3), (255, 0, 0, 128)))
    assert rgba.shape == (3, 4, 3)
    assert rgba[0, 0].tolist() == [1.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="batch of 2"):
        image_to_array(torch.zeros(2, 3, 8, 8))


def test_nan_detection_warns():
    img = np.full((16, 16, 3), 0.5)
    bad = img.copy()
    bad[0, :4, 0] = np.nan
    bad[1, 0, 0] = np.inf
    with pytest.warns(NonFiniteImageWarning, match="madebyollin/sdxl-vae-fp16-fix"):
        q = compare_images(torch.from_numpy(bad).permute(2, 0, 1), img)
    assert q["nan"] is True
    assert math.isnan(q["psnr"]) and math.isnan(q["ssim"])
    assert q["nonfinite_fraction"] == pytest.approx(5 / (16 * 16 * 3))


def test_finite_images_do_not_warn():
    img = _image()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compare_images(img, img)


def test_shape_mismatch_names_both_shapes():
    with pytest.raises(ValueError, match=r"\(64, 48, 3\).*\(32, 48, 3\)"):
        compare_images(_image(h=64), _image(h=32))
