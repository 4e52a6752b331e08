"""Niantic's .spz (v3): a gzip stream of a 16-byte header and attribute planes.

We write version 3 and read versions 2 and 3, the gzip generations of the format published
at github.com/nianticlabs/spz (version 4 swaps gzip for per-stream zstd; Python's standard
library has no zstd before 3.14, so a v4 file is refused with a hint to convert it).

    header (little endian): u32 magic 0x5053474e ("NGSP"), u32 version, u32 numPoints,
                            u8 shDegree, u8 fractionalBits, u8 flags, u8 reserved
    then, plane after plane for all N Gaussians:
      positions  N x 3 x 24-bit signed fixed point (fractionalBits after the point)
      alphas     N x u8   sigmoid(opacity) * 255
      colors     N x 3 u8 DC coefficient * 0.15 * 255 + 127.5
      scales     N x 3 u8 (log scale + 10) * 16
      rotations  v3: N x u32 "smallest three": 2 bits index of the largest |component|,
                 then three 10-bit fields (sign bit, 9-bit magnitude / sqrt(1/2)) in x y z w
                 order with the largest left out; v2: N x 3 u8 of x y z with w >= 0
      sh         N x K-1 x 3 u8 (value * 128 + 128), channel fastest; degree 1 keeps 5 bits,
                 degrees 2 and 3 keep 4 bits (Niantic's defaults)

Coordinates: .spz stores Right-Up-Back axes (OpenGL, three.js); our models are in the INRIA
.ply's Right-Down-Front axes. A 180-degree turn about x maps one onto the other: y and z of
positions and of the quaternion's vector part change sign, and each SH coefficient changes
sign by its basis function's parity in (y, z). Reading undoes the same turn.

The largest error each plane can introduce is in `MAX_ERROR` (the tests hold us and
splat-transform to it).
"""

from __future__ import annotations

import gzip
import struct
import zlib
from pathlib import Path
from typing import Dict, Tuple

import numpy as np
import torch

from turbogs.errors import InputError
from turbogs.fileio import atomic_write_bytes

MAGIC = 0x5053474E
VERSION = 3
HEADER = struct.Struct("<IIIBBBB")
COLOR_SCALE = 0.15
MAX_FRACTIONAL_BITS = 12  # Niantic's choice: 1/4096 unit steps, +-2048 units of range
SH1_BITS, SH_REST_BITS = 5, 4
REST_PER_DEGREE = {0: 0, 1: 3, 2: 8, 3: 15}

# Largest absolute error per attribute, in the stored (pre-activation) units, at 12 fractional bits.
MAX_ERROR = {
    "means": 0.5 / 2**MAX_FRACTIONAL_BITS,
    "scales": 0.5 / 16,  # log scale
    "alpha": 0.5 / 255,  # sigmoid(opacity)
    "sh0": 0.5 / (COLOR_SCALE * 255),
    # per component of the unit quaternion: half a 9-bit step of the three stored ones; the derived
    # largest one moves by sum(q_i dq_i) / q_max, at most 3x that (all four components 1/2)
    "quat": 3 * 0.5 / 511 * 2**-0.5,
    "sh1": (2 ** (8 - SH1_BITS - 1) + 0.5) / 128,
    "sh_rest": (2 ** (8 - SH_REST_BITS - 1) + 0.5) / 128,
}


def sh_flip_signs(num_rest: int) -> np.ndarray:
    """[K-1] signs s_k with Y_k(x, -y, -z) = s_k Y_k(x, y, z), read off our renderer's own SH
    basis (every real SH basis function is even or odd in the pair (y, z))."""
    from turbogs.kernels.raster_torch import spherical_harmonics

    if num_rest == 0:
        return np.ones(0, np.float32)
    degree = {3: 1, 8: 2, 15: 3}[num_rest]
    dirs = torch.tensor([[0.31, 0.52, 0.79]], dtype=torch.float64)
    flipped = dirs * torch.tensor([1.0, -1.0, -1.0], dtype=torch.float64)
    signs = []
    for k in range(1, num_rest + 1):
        coeffs = torch.zeros(1, num_rest + 1, 3, dtype=torch.float64)
        coeffs[0, k] = 1.0
        a = spherical_harmonics(degree, dirs, coeffs)[0, 0]
        b = spherical_harmonics(degree, flipped, coeffs)[0, 0]
        signs.append(float(torch.sign(a * b)))
    return np.asarray(signs, np.float32)


def _u8(x: np.ndarray) -> np.ndarray:
    return np.clip(np.round(x), 0, 255).astype(np.uint8)


def _quantize_sh(x: np.ndarray, bits: int) -> np.ndarray:
    """8-bit value*128+128, then rounded to the nearest multiple of 2^(8-bits) (0 stays exact)."""
    bucket = 1 << (8 - bits)
    q = np.round(x * 128.0) + 128.0
    q = np.floor((q + bucket // 2) / bucket) * bucket
    return np.clip(q, 0, 255).astype(np.uint8)


def _fractional_bits(means: np.ndarray) -> int:
    """12 bits where the scene fits in +-2048 units; fewer (coarser steps) for larger scenes."""
    extent = float(np.abs(means).max()) if means.size else 0.0
    bits = MAX_FRACTIONAL_BITS
    while bits > 0 and extent * 2**bits > 2**23 - 1:
        bits -= 1
    return bits


def _pack_quats_smallest_three(q_xyzw: np.ndarray) -> np.ndarray:
    q = q_xyzw / np.maximum(np.linalg.norm(q_xyzw, axis=1, keepdims=True), 1e-12)
    largest = np.argmax(np.abs(q), axis=1)
    negate = np.take_along_axis(q, largest[:, None], axis=1)[:, 0] < 0
    comp = largest.astype(np.uint32)
    # Components in x y z w order, skipping the largest, each appended as 10 bits.
    for i in range(4):
        keep = largest != i
        negbit = ((q[:, i] < 0) ^ negate).astype(np.uint32)
        mag = (511.0 * (np.abs(q[:, i]) / np.sqrt(0.5)) + 0.5).astype(np.uint32)
        mag = np.minimum(mag, 511)
        comp = np.where(keep, (comp << 10) | (negbit << 9) | mag, comp)
    return comp.astype("<u4")


def _unpack_quats_smallest_three(comp: np.ndarray) -> np.ndarray:
    comp = comp.astype(np.uint32)
    largest = comp >> 30
    q = np.zeros((comp.shape[0], 4), np.float64)
    rest = comp.copy()
    for i in (3, 2, 1, 0):  # the last stored component sits in the lowest bits
        skip = largest == i
        mag = (rest & 511).astype(np.float64) * np.sqrt(0.5) / 511.0
        value = np.where((rest >> 9) & 1, -mag, mag)
        q[:, i] = np.where(skip, 0.0, value)
        rest = np.where(skip, rest, rest >> 10)
    q[np.arange(len(q)), largest] = np.sqrt(np.maximum(0.0, 1.0 - (q**2).sum(axis=1)))
    return q


# The header's flags byte: bit 0 says the splats were trained with the antialiasing filter
# (Niantic's FlagAntialiased), so that a renderer that reads it applies the compensation too.
FLAG_ANTIALIASED = 0x1


def encode(params: Dict[str, np.ndarray], antialiased: bool = False) -> bytes:
    """The gzip-compressed v3 .spz bytes of pre-activation parameters (INRIA .ply axes);
    `antialiased` sets the header's antialiased flag."""
    means = np.asarray(params["means"], np.float64)
    n = means.shape[0]
    num_rest = params["shN"].shape[1]
    degree = {v: k for k, v in REST_PER_DEGREE.items()}[num_rest]
    flip = np.array([1.0, -1.0, -1.0])
    bits = _fractional_bits(means)

    fixed = np.round(means * flip * 2**bits).astype(np.int64) & 0xFFFFFF
    positions = np.stack([fixed & 0xFF, (fixed >> 8) & 0xFF, (fixed >> 16) & 0xFF], axis=-1).astype(np.uint8)
    alphas = _u8(255.0 / (1.0 + np.exp(-np.asarray(params["opacities"], np.float64))))
    colors = _u8(np.asarray(params["sh0"], np.float64).reshape(n, 3) * (COLOR_SCALE * 255) + 127.5)
    scales = _u8((np.asarray(params["scales"], np.float64) + 10.0) * 16.0)
    w, x, y, z = np.asarray(params["quats"], np.float64).T
    rotations = _pack_quats_smallest_three(np.stack([x, -y, -z, w], axis=1))  # RUB, x y z w order
    sh = np.asarray(params["shN"], np.float64) * sh_flip_signs(num_rest)[None, :, None]
    sh_bytes = np.concatenate(
        [_quantize_sh(sh[:, :3], SH1_BITS), _quantize_sh(sh[:, 3:], SH_REST_BITS)], axis=1) if num_rest else sh.astype(np.uint8)
    body = b"".join([HEADER.pack(MAGIC, VERSION, n, degree, bits, FLAG_ANTIALIASED if antialiased else 0, 0), positions.tobytes(), alphas.tobytes(),
                     colors.tobytes(), scales.tobytes(), rotations.tobytes(), sh_bytes.astype(np.uint8).tobytes()])
    return gzip.compress(body, compresslevel=9, mtime=0)


def write_spz(path, params: Dict[str, np.ndarray], antialiased: bool = False) -> None:
    atomic_write_bytes(path, encode(params, antialiased))


def _bad(path, problem: str) -> InputError:
    return InputError(f"bad .spz file {path}: {problem}")


def decode(data: bytes, path="<bytes>") -> Tuple[Dict[str, np.ndarray], int]:
    """(pre-activation float32 params in INRIA .ply axes, SH degree) of .spz bytes (v2 or v3)."""
    if data[:4] == b"NGSP":
        raise _bad(path, "version 4 (zstd) is not supported; convert it with "
                         "`splat-transform --spz-version 3 in.spz out.spz`")
    try:
        body = gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as exc:
        raise _bad(path, f"not a gzip stream ({exc})") from None
    if len(body) < HEADER.size:
        raise _bad(path, f"{len(body)} bytes after gunzip, shorter than the 16-byte header")
    magic, version, n, degree, bits, _flags, _ = HEADER.unpack_from(body)
    if magic != MAGIC:
        raise _bad(path, f"magic is {magic:#x}, expected {MAGIC:#x} ('NGSP')")
    if version not in (2, 3):
        raise _bad(path, f"version {version} is not supported (we read 2 and 3)")
    if degree not in REST_PER_DEGREE:
        raise _bad(path, f"SH degree {degree} is not 0..3")
    if bits > 23:
        raise _bad(path, f"{bits} fractional bits do not fit a 24-bit coordinate")
    num_rest = REST_PER_DEGREE[degree]
    rot_bytes = 4 if version >= 3 else 3
    sizes = [9 * n, n, 3 * n, 3 * n, rot_bytes * n, 3 * num_rest * n]
    if len(body) != HEADER.size + sum(sizes):
        raise _bad(path, f"{len(body) - HEADER.size} bytes of data, but {n} Gaussians of SH degree {degree} "
                         f"need {sum(sizes)} (truncated or corrupt)")
    planes, offset = [], HEADER.size
    for size in sizes:
        planes.append(np.frombuffer(body, np.uint8, size, offset))
        offset += size
    positions, alphas, colors, scales, rotations, sh = planes

    p = positions.reshape(n, 3, 3).astype(np.int32)
    fixed = p[..., 0] | (p[..., 1] << 8) | (p[..., 2] << 16)
    fixed = np.where(fixed & 0x800000, fixed - (1 << 24), fixed)
    flip = np.array([1.0, -1.0, -1.0])
    means = fixed.astype(np.float64) / 2**bits * flip
    alpha = np.clip(alphas.astype(np.float64) / 255.0, 1e-7, 1 - 1e-7)
    if version >= 3:
        q = _unpack_quats_smallest_three(rotations.view("<u4"))
    else:
        xyz = rotations.reshape(n, 3).astype(np.float64) / 127.5 - 1.0
        q = np.concatenate([xyz, np.sqrt(np.maximum(0.0, 1.0 - (xyz**2).sum(1)))[:, None]], axis=1)
    x, y, z, w = q.T
    shn = (sh.reshape(n, num_rest, 3).astype(np.float64) - 128.0) / 128.0 * sh_flip_signs(num_rest)[None, :, None]
    params = {
        "means": means,
        "scales": scales.reshape(n, 3).astype(np.float64) / 16.0 - 10.0,
        "quats": np.stack([w, x, -y, -z], axis=1),
        "opacities": np.log(alpha / (1.0 - alpha)),
        "sh0": ((colors.reshape(n, 1, 3).astype(np.float64) / 255.0) - 0.5) / COLOR_SCALE,
        "shN": shn,
    }
    return {k: v.astype(np.float32) for k, v in params.items()}, degree


def read_spz(path) -> Tuple[Dict[str, np.ndarray], int]:
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None
    return decode(data, path)
