"""Reading the generated video and undoing the pipeline's square padding."""

from __future__ import annotations

import numpy as np


def read_frames(path: str) -> np.ndarray:
    import av

    with av.open(str(path)) as container:
        frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
    if not frames:
        raise ValueError(f"{path}: no frames")
    return np.stack(frames)


def read_image(path: str) -> np.ndarray:
    from PIL import Image

    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"))


def unpad_resize(frame: np.ndarray, height: int, width: int) -> np.ndarray:
    """Crop the centred content of a square-padded frame and resize it to height x width."""
    from PIL import Image

    side = frame.shape[0]
    scale = side / max(height, width)
    content_h, content_w = round(height * scale), round(width * scale)
    top, left = (side - content_h) // 2, (frame.shape[1] - content_w) // 2
    crop = frame[top:top + content_h, left:left + content_w]
    return np.asarray(Image.fromarray(crop).resize((width, height), Image.BILINEAR))
