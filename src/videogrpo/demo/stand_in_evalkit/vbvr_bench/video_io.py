"""Reading the generated video."""

from __future__ import annotations

import numpy as np


def read_frames(path: str) -> np.ndarray:
    import av

    with av.open(str(path)) as container:
        frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
    if not frames:
        raise ValueError(f"{path}: no frames")
    return np.stack(frames)
