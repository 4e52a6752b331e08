"""psnr_vs_time.png: one PSNR curve per preset against training seconds, drawn with OpenCV."""

from __future__ import annotations

import math
from pathlib import Path
from typing import List

import cv2
import numpy as np

# --- the plot -----------------------------------------------------------------------

PLOT_SIZE = (960, 600)  # width, height in pixels
PLOT_MARGINS = (90, 30, 50, 80)  # left, right, top, bottom
# Tableau's colors, as BGR for OpenCV.
CURVE_COLORS = [(180, 119, 31), (14, 127, 255), (44, 160, 44), (40, 39, 214), (189, 103, 148), (75, 86, 140)]
FONT = cv2.FONT_HERSHEY_SIMPLEX


def nice_ticks(low: float, high: float, count: int = 6) -> List[float]:
    """Round tick values (1, 2 or 5 times a power of ten apart) covering [low, high]."""
    if not high > low:
        low, high = low - 0.5, high + 0.5
    raw = (high - low) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    # A run stopped by a time budget ends a hair past it (150.14 s of 150): within 1 % of a
    # step (about a pixel) counts as on the tick, rather than adding a tick of empty axis.
    first, last = math.floor(low / step + 0.01), math.ceil(high / step - 0.01)
    return [round(i * step, 10) for i in range(first, last + 1)]


def _tick_label(value: float, ticks: List[float]) -> str:
    step = ticks[1] - ticks[0] if len(ticks) > 1 else 1.0
    decimals = max(0, -math.floor(math.log10(step) + 1e-9))
    return f"{value:.{decimals}f}"


def _put_centered(image, text, center_x, baseline_y, scale=0.5, thickness=1, color=(0, 0, 0)):
    (w, _), _ = cv2.getTextSize(text, FONT, scale, thickness)
    cv2.putText(image, text, (int(center_x - w / 2), int(baseline_y)), FONT, scale, color, thickness, cv2.LINE_AA)


def draw_psnr_plot(result: dict) -> np.ndarray:
    """Test PSNR against training seconds, one curve per preset: a BGR uint8 image."""
    width, height = PLOT_SIZE
    left, right, top, bottom = PLOT_MARGINS
    image = np.full((height, width, 3), 255, np.uint8)
    curves = {name: [(p["seconds"], p["psnr"]) for p in entry["points"] if p.get("psnr") is not None]
              for name, entry in result["presets"].items()}
    xs = [x for curve in curves.values() for x, _ in curve] or [0.0, 1.0]
    ys = [y for curve in curves.values() for _, y in curve] or [0.0, 1.0]
    x_ticks = nice_ticks(0.0, max(max(xs), 1e-3))
    y_ticks = nice_ticks(min(ys), max(ys))
    x0, x1, y0, y1 = x_ticks[0], x_ticks[-1], y_ticks[0], y_ticks[-1]

    def to_pixel(x: float, y: float):
        px = left + (x - x0) / (x1 - x0) * (width - left - right)
        py = height - bottom - (y - y0) / (y1 - y0) * (height - top - bottom)
        return int(round(px)), int(round(py))

    # Grid, ticks and tick labels.
    for x in x_ticks:
        px, _ = to_pixel(x, y0)
        cv2.line(image, (px, top), (px, height - bottom), (225, 225, 225), 1)
        cv2.line(image, (px, height - bottom), (px, height - bottom + 5), (0, 0, 0), 1)
        _put_centered(image, _tick_label(x, x_ticks), px, height - bottom + 22)
    for y in y_ticks:
        _, py = to_pixel(x0, y)
        cv2.line(image, (left, py), (width - right, py), (225, 225, 225), 1)
        cv2.line(image, (left - 5, py), (left, py), (0, 0, 0), 1)
        label = _tick_label(y, y_ticks)
        (w, h), _ = cv2.getTextSize(label, FONT, 0.5, 1)
        cv2.putText(image, label, (left - 9 - w, py + h // 2), FONT, 0.5, (0, 0, 0), 1, cv2.LINE_AA)
    cv2.rectangle(image, (left, top), (width - right, height - bottom), (0, 0, 0), 1)

    # Axis labels and title; the y label is drawn on its own strip and rotated.
    _put_centered(image, "training time (s)", (left + width - right) / 2, height - 22, scale=0.6)
    strip = np.full((30, height - top - bottom, 3), 255, np.uint8)
    _put_centered(strip, "test PSNR (dB)", strip.shape[1] / 2, 21, scale=0.6)
    strip = cv2.rotate(strip, cv2.ROTATE_90_COUNTERCLOCKWISE)
    image[top:top + strip.shape[0], 8:8 + strip.shape[1]] = strip
    title = f"{Path(result['scene']).name}: test PSNR vs training time ({result['device']})"
    _put_centered(image, title, width / 2, 32, scale=0.65)

    # Curves with a marker at every evaluation, then the legend (lower right).
    for index, (name, curve) in enumerate(curves.items()):
        color = CURVE_COLORS[index % len(CURVE_COLORS)]
        pixels = np.array([to_pixel(x, y) for x, y in curve], np.int32)
        if len(pixels) > 1:
            cv2.polylines(image, [pixels.reshape(-1, 1, 2)], False, color, 2, cv2.LINE_AA)
        for px, py in pixels:
            cv2.circle(image, (int(px), int(py)), 4, color, -1, cv2.LINE_AA)
    names = list(curves)
    if names:
        text_width = max(cv2.getTextSize(n, FONT, 0.55, 1)[0][0] for n in names)
        box_w, box_h = text_width + 60, 24 * len(names) + 12
        bx, by = width - right - box_w - 10, height - bottom - box_h - 10
        cv2.rectangle(image, (bx, by), (bx + box_w, by + box_h), (255, 255, 255), -1)
        cv2.rectangle(image, (bx, by), (bx + box_w, by + box_h), (120, 120, 120), 1)
        for index, name in enumerate(names):
            color = CURVE_COLORS[index % len(CURVE_COLORS)]
            cy = by + 18 + 24 * index
            cv2.line(image, (bx + 8, cy), (bx + 38, cy), color, 2, cv2.LINE_AA)
            cv2.circle(image, (bx + 23, cy), 4, color, -1, cv2.LINE_AA)
            cv2.putText(image, name, (bx + 46, cy + 5), FONT, 0.55, (0, 0, 0), 1, cv2.LINE_AA)
    return image
