"""PlayCanvas's SOG (version 2): lossless WebP textures plus meta.json, bundled in one zip.

A .sog file is a zip archive (entries stored, not deflated: WebP is already compressed) of

    meta.json          {"version": 2, "count": N, "means": {mins, maxs, files}, "scales": {codebook,
                       files}, "quats": {files}, "sh0": {codebook, files}, "shN": {count, bands,
                       codebook, files}}
    means_l.webp       low bytes  } of a 16-bit per-axis position, linear between mins and maxs of
    means_u.webp       high bytes } sign(x) * log(|x| + 1) (fine steps near the origin)
    quats.webp         three quaternion components scaled by sqrt(2) to [0, 255]; alpha 252 + the
                       index (w x y z) of the largest one, which is left out and derived
    scales.webp        per-axis index into a 256-entry codebook of log scales
    sh0.webp           per-channel index into a 256-entry codebook of DC coefficients; alpha =
                       sigmoid(opacity) * 255
    shN_labels.webp    16-bit index (R low byte, G high byte) into a palette of SH vectors
    shN_centroids.webp the palette, 64 entries a row, each K-1 texels whose RGB index a 256-entry
                       codebook of SH coefficients

Texel i (row-major) belongs to Gaussian i; Gaussians are stored in Morton order of their positions,
as splat-transform does, so that neighbours in the image are neighbours in space and compress well.
Everything stays in the INRIA .ply's axes. Codebooks and the SH palette come from k-means (1-D
Lloyd's for the 256-entry codebooks; k-means on the SH vectors, on the model's device).

One catch of lossless WebP: a texel with alpha 0 may lose its RGB, so sh0's opacity byte is kept
at 1 or more (an invisible Gaussian then has alpha 1/255 instead of < 1/255).
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Dict, Tuple

import cv2
import numpy as np
import torch

from turbogs.errors import InputError
from turbogs.fileio import atomic_path

VERSION = 2
REST_PER_BANDS = {0: 0, 1: 3, 2: 8, 3: 15}
KMEANS_ITERATIONS = 10

# Largest error of the fixed-step planes (codebook planes: half the gap between neighbouring entries).
MAX_ERROR = {
    "alpha": 1.0 / 255,  # sigmoid(opacity); 0.5/255 from rounding, up to 1/255 at the alpha >= 1 floor
    "quat": 3 * 0.5 / 255 * 2 * 2**-0.5,  # per component of the unit quaternion, as in spz.MAX_ERROR
}


# --- quantisers ---------------------------------------------------------------------------


def log_transform(x: np.ndarray) -> np.ndarray:
    return np.sign(x) * np.log1p(np.abs(x))


def inverse_log_transform(v: np.ndarray) -> np.ndarray:
    return np.sign(v) * np.expm1(np.abs(v))


def kmeans_1d(values: np.ndarray, k: int = 256, iterations: int = 20) -> Tuple[np.ndarray, np.ndarray]:
    """(sorted codebook [k], labels) of 1-D Lloyd's k-means, started from the quantiles.
    Sorted centroids make the assignment a binary search against the midpoints."""
    values = np.asarray(values, np.float64).ravel()
    codebook = np.unique(np.quantile(values, (np.arange(k) + 0.5) / k))
    for _ in range(iterations):
        labels = np.searchsorted((codebook[1:] + codebook[:-1]) / 2, values)
        sums = np.bincount(labels, values, minlength=len(codebook))
        counts = np.bincount(labels, minlength=len(codebook))
        updated = np.where(counts > 0, sums / np.maximum(counts, 1), codebook)
        if np.allclose(updated, codebook, rtol=0, atol=0):
            break
        codebook = np.sort(updated)
    codebook = np.pad(codebook, (0, k - len(codebook)), mode="edge")  # always k entries
    labels = np.searchsorted((codebook[1:] + codebook[:-1]) / 2, values)
    return codebook.astype(np.float32), labels.astype(np.uint8)


def _nearest(points: torch.Tensor, centroids: torch.Tensor, chunk: int = 8192) -> torch.Tensor:
    out = torch.empty(points.shape[0], dtype=torch.long, device=points.device)
    for start in range(0, points.shape[0], chunk):
        out[start:start + chunk] = torch.cdist(points[start:start + chunk], centroids).argmin(dim=1)
    return out


def kmeans(points: np.ndarray, k: int, iterations: int = KMEANS_ITERATIONS, seed: int = 0,
           device: str = "cpu") -> Tuple[np.ndarray, np.ndarray]:
    """(centroids [k, D], labels [N]) of Lloyd's k-means from k distinct random points.
    With k >= N every point is its own centroid (nothing to cluster)."""
    n = points.shape[0]
    if k >= n:
        return points.astype(np.float32), np.arange(n)
    from tqdm import tqdm

    x = torch.as_tensor(points, dtype=torch.float32, device=device)
    generator = torch.Generator().manual_seed(seed)
    centroids = x[torch.randperm(n, generator=generator)[:k].to(device)].clone()
    # minutes for a million Gaussians on a CPU (N x k distances a pass): show it
    for _ in tqdm(range(iterations), desc=f"SH k-means ({k} of {n})", unit="pass", disable=n < 10_000, leave=False):
        labels = _nearest(x, centroids)
        sums = torch.zeros_like(centroids).index_add_(0, labels, x)
        counts = torch.bincount(labels, minlength=k).to(x.dtype)[:, None]
        centroids = torch.where(counts > 0, sums / counts.clamp(min=1), centroids)
    labels = _nearest(x, centroids)
    return centroids.cpu().numpy(), labels.cpu().numpy()


def morton_order(means: np.ndarray) -> np.ndarray:
    """Indices sorting the Gaussians along a Z-order curve of their (10-bit quantised) positions."""
    lo, hi = means.min(axis=0), means.max(axis=0)
    cells = ((means - lo) / np.maximum(hi - lo, 1e-12) * 1023).astype(np.uint64)
    code = np.zeros(len(means), np.uint64)
    for bit in range(10):
        for axis in range(3):
            code |= ((cells[:, axis] >> np.uint64(bit)) & np.uint64(1)) << np.uint64(3 * bit + axis)
    return np.argsort(code, kind="stable")


# --- textures ------------------------------------------------------------------------------


def texture_size(n: int) -> Tuple[int, int]:
    width = int(np.ceil(np.sqrt(n) / 4) * 4)
    return max(width, 4), max(int(np.ceil(n / max(width, 4) / 4) * 4), 4)


def _webp(rgba: np.ndarray) -> bytes:
    """Lossless WebP bytes of an RGBA uint8 image (quality above 100 selects lossless in OpenCV)."""
    ok, buf = cv2.imencode(".webp", cv2.cvtColor(rgba, cv2.COLOR_RGBA2BGRA), [cv2.IMWRITE_WEBP_QUALITY, 101])
    if not ok:
        raise RuntimeError("OpenCV could not encode a WebP image")
    return buf.tobytes()


def _texture(per_gaussian: np.ndarray, size: Tuple[int, int], alpha: int = 255) -> np.ndarray:
    """[W*H] texels of up to 4 byte channels per Gaussian, padded, as an [H, W, 4] image."""
    width, height = size
    image = np.zeros((width * height, 4), np.uint8)
    image[:, 3] = alpha
    image[: len(per_gaussian), : per_gaussian.shape[1]] = per_gaussian
    return image.reshape(height, width, 4)


def _pack_quats(quats_wxyz: np.ndarray) -> np.ndarray:
    q = quats_wxyz / np.maximum(np.linalg.norm(quats_wxyz, axis=1, keepdims=True), 1e-12)
    largest = np.argmax(np.abs(q), axis=1)
    q = q * np.where(np.take_along_axis(q, largest[:, None], 1) < 0, -1.0, 1.0)
    others = np.array([[1, 2, 3], [0, 2, 3], [0, 1, 3], [0, 1, 2]])[largest]
    small = np.take_along_axis(q, others, 1) * np.sqrt(2.0)
    rgb = np.clip(np.round(255.0 * (small * 0.5 + 0.5)), 0, 255)
    return np.concatenate([rgb, (252 + largest)[:, None]], axis=1).astype(np.uint8)


def _unpack_quats(texels: np.ndarray) -> np.ndarray:
    tag = texels[:, 3].astype(np.int64)
    if ((tag < 252) | (tag > 255)).any():
        raise ValueError("quats.webp has a texel whose alpha is not 252..255")
    largest = tag - 252
    small = (texels[:, :3].astype(np.float64) / 255.0 - 0.5) * 2.0 / np.sqrt(2.0)
    q = np.zeros((len(texels), 4))
    others = np.array([[1, 2, 3], [0, 2, 3], [0, 1, 3], [0, 1, 2]])[largest]
    np.put_along_axis(q, others, small, 1)
    q[np.arange(len(q)), largest] = np.sqrt(np.maximum(0.0, 1.0 - (small**2).sum(1)))
    return q


# --- writing -------------------------------------------------------------------------------


def encode(params: Dict[str, np.ndarray], device: str = "cpu") -> Dict[str, bytes]:
    """The archive's entries (name -> bytes) for pre-activation parameters."""
    order = morton_order(np.asarray(params["means"], np.float64))
    p = {k: np.asarray(v, np.float64)[order] for k, v in params.items()}
    n = len(order)
    num_rest = p["shN"].shape[1]
    bands = {v: k for k, v in REST_PER_BANDS.items()}[num_rest]
    size = texture_size(n)
    files: Dict[str, bytes] = {}

    logs = log_transform(p["means"])
    mins, maxs = logs.min(axis=0), logs.max(axis=0)
    q16 = np.round(65535 * (logs - mins) / np.where(maxs > mins, maxs - mins, 1.0)).astype(np.uint32)
    files["means_l.webp"] = _webp(_texture((q16 & 0xFF).astype(np.uint8), size))
    files["means_u.webp"] = _webp(_texture((q16 >> 8).astype(np.uint8), size))
    files["quats.webp"] = _webp(_texture(_pack_quats(p["quats"]), size))
    scale_codebook, scale_labels = kmeans_1d(p["scales"])
    files["scales.webp"] = _webp(_texture(scale_labels.reshape(n, 3), size))
    color_codebook, color_labels = kmeans_1d(p["sh0"].reshape(n, 3))
    alpha = np.clip(np.round(255.0 / (1.0 + np.exp(-p["opacities"]))), 1, 255).astype(np.uint8)
    files["sh0.webp"] = _webp(_texture(np.concatenate([color_labels.reshape(n, 3), alpha[:, None]], 1), size))
    meta = {
        "version": VERSION, "asset": {"generator": "turbogs"}, "count": n,
        "means": {"mins": mins.tolist(), "maxs": maxs.tolist(), "files": ["means_l.webp", "means_u.webp"]},
        "scales": {"codebook": scale_codebook.tolist(), "files": ["scales.webp"]},
        "quats": {"files": ["quats.webp"]},
        "sh0": {"codebook": color_codebook.tolist(), "files": ["sh0.webp"]},
    }
    if num_rest:
        meta["shN"] = _encode_sh(p["shN"], bands, size, files, device)
    files["meta.json"] = json.dumps(meta).encode()
    return files


def palette_size(n: int) -> int:
    """splat-transform's palette: 1024 x the power of two nearest below N/1024, at most 65536."""
    return int(min(64, 2 ** np.floor(np.log2(max(n, 1) / 1024))) * 1024)


def _encode_sh(shn: np.ndarray, bands: int, size, files: Dict[str, bytes], device: str) -> dict:
    n, num_rest, _ = shn.shape
    vectors = shn.transpose(0, 2, 1).reshape(n, 3 * num_rest)  # channel-major, as f_rest_*
    count = palette_size(n)
    centroids, labels = kmeans(vectors, count, device=device)
    codebook, centroid_labels = kmeans_1d(centroids)
    centroid_labels = centroid_labels.reshape(len(centroids), 3, num_rest).transpose(0, 2, 1)  # [C, K-1, rgb]
    rows = (len(centroids) + 63) // 64
    palette = np.zeros((rows * 64, num_rest, 4), np.uint8)
    palette[:, :, 3] = 255
    palette[: len(centroids), :, :3] = centroid_labels
    palette = palette.reshape(rows, 64 * num_rest, 4)
    label_texels = np.stack([labels & 0xFF, labels >> 8], axis=1).astype(np.uint8)
    files["shN_centroids.webp"] = _webp(palette)
    files["shN_labels.webp"] = _webp(_texture(label_texels, size))
    return {"count": max(count, len(centroids)), "bands": bands, "codebook": codebook.tolist(),
            "files": ["shN_centroids.webp", "shN_labels.webp"]}


def write_sog(path, params: Dict[str, np.ndarray], device: str = "cpu") -> None:
    """Write the bundled .sog (a stored zip, meta.json first), atomically."""
    files = encode(params, device)
    with atomic_path(path) as tmp:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED) as archive:
            for name in ["meta.json"] + sorted(k for k in files if k != "meta.json"):
                archive.writestr(zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0)), files[name])


# --- reading -------------------------------------------------------------------------------


def _bad(path, problem: str) -> InputError:
    return InputError(f"bad .sog file {path}: {problem}")


def _image(files: Dict[str, bytes], name: str, count: int, path) -> np.ndarray:
    """[count, 4] RGBA texels of one WebP entry."""
    if name not in files:
        raise _bad(path, f"meta.json names '{name}', which is not in the archive")
    image = cv2.imdecode(np.frombuffer(files[name], np.uint8), cv2.IMREAD_UNCHANGED)
    if image is None:
        raise _bad(path, f"'{name}' is not a readable WebP image")
    if image.ndim == 2:
        image = cv2.cvtColor(image, cv2.COLOR_GRAY2BGRA)
    elif image.shape[2] == 3:
        image = cv2.cvtColor(image, cv2.COLOR_BGR2BGRA)
    texels = cv2.cvtColor(image, cv2.COLOR_BGRA2RGBA).reshape(-1, 4)
    if len(texels) < count:
        raise _bad(path, f"'{name}' has {len(texels)} texels for {count} Gaussians")
    return texels[:count] if count >= 0 else texels


def decode(files: Dict[str, bytes], path="<sog>") -> Tuple[Dict[str, np.ndarray], int]:
    """(pre-activation float32 params in file order, SH degree) of a SOG v2 archive's entries."""
    try:
        meta = json.loads(files["meta.json"])
        n = int(meta["count"])
        if meta.get("version") != VERSION:
            raise _bad(path, f"meta.json version {meta.get('version')!r}; we read version {VERSION}")
        lo = _image(files, meta["means"]["files"][0], n, path).astype(np.uint32)
        hi = _image(files, meta["means"]["files"][1], n, path).astype(np.uint32)
        mins, maxs = np.asarray(meta["means"]["mins"], np.float64), np.asarray(meta["means"]["maxs"], np.float64)
        q16 = (lo[:, :3] | (hi[:, :3] << 8)).astype(np.float64)
        means = inverse_log_transform(mins + (maxs - mins) * q16 / 65535.0)
        quats = _unpack_quats(_image(files, meta["quats"]["files"][0], n, path))
        scales = np.asarray(meta["scales"]["codebook"], np.float64)[_image(files, meta["scales"]["files"][0], n, path)[:, :3]]
        sh0_texels = _image(files, meta["sh0"]["files"][0], n, path)
        sh0 = np.asarray(meta["sh0"]["codebook"], np.float64)[sh0_texels[:, :3]]
        alpha = np.clip(sh0_texels[:, 3].astype(np.float64) / 255.0, 1e-7, 1 - 1e-7)
        bands, shn = 0, np.zeros((n, 0, 3))
        if "shN" in meta:
            bands = int(meta["shN"]["bands"])
            shn = _decode_sh(files, meta["shN"], bands, n, path)
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        if isinstance(exc, InputError):
            raise
        raise _bad(path, f"unexpected meta.json or texture content ({type(exc).__name__}: {exc})") from None
    params = {"means": means, "scales": scales, "quats": quats, "opacities": np.log(alpha / (1 - alpha)),
              "sh0": sh0.reshape(n, 1, 3), "shN": shn}
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in params.items()}, bands


def _decode_sh(files, meta_sh: dict, bands: int, n: int, path) -> np.ndarray:
    num_rest = REST_PER_BANDS[bands]
    codebook = np.asarray(meta_sh["codebook"], np.float64)
    labels_texels = _image(files, meta_sh["files"][1], n, path).astype(np.int64)
    labels = labels_texels[:, 0] | (labels_texels[:, 1] << 8)
    palette = _image(files, meta_sh["files"][0], -1, path)
    rows = len(palette) // (64 * num_rest)
    palette = palette.reshape(rows * 64, num_rest, 4)
    if labels.max(initial=0) >= min(int(meta_sh["count"]), len(palette)):
        raise _bad(path, "an SH label points past the palette")
    return codebook[palette[labels, :, :3]]  # [N, K-1, rgb]


def read_sog(path) -> Tuple[Dict[str, np.ndarray], int]:
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as archive:
            files = {name: archive.read(name) for name in archive.namelist()
                     if name == "meta.json" or name.endswith(".webp")}
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise _bad(path, f"not a zip archive ({exc})") from None
    if "meta.json" not in files:
        raise _bad(path, "no meta.json in the archive")
    return decode(files, path)

