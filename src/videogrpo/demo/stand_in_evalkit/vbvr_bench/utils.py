"""Image helpers of the evaluators: reading a ground-truth PNG, undoing the pipeline's square padding.

Imports at module level what the public EvalKit's vbvr_bench/utils.py imports there (cv2, numpy, PIL), so that a
scorer environment lacking one fails here as it fails with the real EvalKit.
"""

from __future__ import annotations

import cv2  # noqa: F401 - imported for what it requires of the environment, as the public EvalKit's utils.py does
import numpy as np
from PIL import Image


def read_image(path: str) -> np.ndarray:
    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"))


def unpad_resize(frame: np.ndarray, height: int, width: int) -> np.ndarray:
    """Crop the centred content of a square-padded frame and resize it to height x width."""
    side = frame.shape[0]
    scale = side / max(height, width)
    content_h, content_w = round(height * scale), round(width * scale)
    top, left = (side - content_h) // 2, (frame.shape[1] - content_w) // 2
    crop = frame[top:top + content_h, left:left + content_w]
    return np.asarray(Image.fromarray(crop).resize((width, height), Image.BILINEAR))
