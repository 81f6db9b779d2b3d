"""Evaluators of the synthetic tasks: a rule read from the final frame, and fidelity to the ground truth."""

from __future__ import annotations

import cv2  # noqa: F401 - imported for what it requires of the environment, as the public EvalKit's evaluators do
import numpy as np

# Colour distance (RGB, 0-255) at which similarity falls to exp(-1/2); wide enough for H.264's
# chroma subsampling of saturated colours.
COLOR_SCALE = 80.0


def color_similarity(pixels: np.ndarray, color) -> np.ndarray:
    """Per-pixel similarity in [0, 1] to an RGB colour (1 = exact)."""
    diff = pixels.astype(np.float64) - np.asarray(color, dtype=np.float64)
    return np.exp(-(diff ** 2).sum(axis=-1) / (2 * COLOR_SCALE ** 2))


def fidelity(final: np.ndarray, gt_final: np.ndarray) -> float:
    return float(1.0 - np.abs(final.astype(np.float64) - gt_final.astype(np.float64)).mean() / 255.0)


def _dimensions(rule: float, final: np.ndarray, gt_final: np.ndarray) -> dict:
    return {"rule": float(np.clip(rule, 0.0, 1.0)), "fidelity": fidelity(final, gt_final)}


def move_red_square(final: np.ndarray, gt_final: np.ndarray, meta: dict) -> dict:
    ch, cw = meta["cell_size"]
    r, c = meta["target_cell"]
    # The central half of where the square belongs: edges blur under compression and resizing.
    my, mx = ch // 4 + ch // 8, cw // 4 + cw // 8
    inner = final[r * ch + my: (r + 1) * ch - my, c * cw + mx: (c + 1) * cw - mx]
    return _dimensions(color_similarity(inner, meta["square_color"]).mean(), final, gt_final)


def fill_circle_blue(final: np.ndarray, gt_final: np.ndarray, meta: dict) -> dict:
    cy, cx = meta["center"]
    yy, xx = np.mgrid[:final.shape[0], :final.shape[1]]
    inside = (yy - cy) ** 2 + (xx - cx) ** 2 <= (meta["radius"] - 2) ** 2
    return _dimensions(color_similarity(final[inside], meta["fill_color"]).mean(), final, gt_final)


def grow_bar_to_line(final: np.ndarray, gt_final: np.ndarray, meta: dict) -> dict:
    x0, x1 = meta["bar_x"]
    top = meta["target_top"]
    filled = color_similarity(final[top + 2:, x0 + 1:x1 - 1], meta["bar_color"]).mean()
    above = color_similarity(final[:max(top - 2, 1), x0:x1], meta["bar_color"]).mean()
    return _dimensions(filled * (1.0 - above), final, gt_final)
