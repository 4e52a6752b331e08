"""INRIA-layout .ply model files (read and write), and INRIA's input point cloud.

The INRIA .ply is the lingua franca of 3DGS viewers (SuperSplat, the antimatter15 and
gsplat viewers, INRIA's SIBR). One vertex per Gaussian, all float32, binary little endian:

    x y z  nx ny nz  f_dc_0..2  f_rest_0..M-1  opacity  scale_0..2  rot_0..3

Values are pre-activation, exactly as `turbogs.gaussians` stores them (log scales,
logit opacity, unnormalized wxyz quaternion). f_rest is *channel-major*: all higher-band
coefficients of red, then green, then blue, so f_rest index = c * (K-1) + k for SH
coefficient k (1-based band index minus one) of channel c. Viewers infer the SH degree
from M (0, 9, 24, 45 for degrees 0..3); normals are unused and written as zeros.

Reading never trusts the header: the vertex count is checked against the file size
before anything is allocated, so a 100-byte file claiming 10^12 vertices is refused
at once instead of exhausting memory.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Dict, List, Tuple, Union

import numpy as np
from plyfile import PlyData, PlyElement

from turbogs.errors import InputError
from turbogs.fileio import atomic_path

PathLike = Union[str, "os.PathLike[str]"]
Params = Dict[str, np.ndarray]

# Higher-band SH coefficients per color channel (K - 1) for SH degrees 0..3, and back.
_REST_PER_CHANNEL = {0: 0, 1: 3, 2: 8, 3: 15}
_DEGREE_OF_REST_FIELDS = {3 * rest: degree for degree, rest in _REST_PER_CHANNEL.items()}

# A header is a few kilobytes; reading at most this much bounds memory on garbage input.
_MAX_HEADER_BYTES = 1 << 16

_PLY_SCALAR_TYPES = {
    "char": "i1", "int8": "i1", "uchar": "u1", "uint8": "u1",
    "short": "i2", "int16": "i2", "ushort": "u2", "uint16": "u2",
    "int": "i4", "int32": "i4", "uint": "u4", "uint32": "u4",
    "float": "f4", "float32": "f4", "double": "f8", "float64": "f8",
}  # fmt: skip


def vertex_field_names(sh_degree: int) -> List[str]:
    """The INRIA vertex properties, in file order, for a model of `sh_degree`."""
    num_rest = 3 * _REST_PER_CHANNEL[sh_degree]
    return (
        ["x", "y", "z", "nx", "ny", "nz", "f_dc_0", "f_dc_1", "f_dc_2"]
        + [f"f_rest_{i}" for i in range(num_rest)]
        + ["opacity", "scale_0", "scale_1", "scale_2", "rot_0", "rot_1", "rot_2", "rot_3"]
    )


# --- writing ----------------------------------------------------------------------


def _as_float32(x) -> np.ndarray:
    """numpy or torch (any device) -> float32 numpy."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=np.float32)


def checked_params(params) -> Tuple[Params, int]:
    """Float32 copies of the six arrays with their shapes checked; and the SH degree."""
    p = {name: _as_float32(params[name]) for name in ("means", "scales", "quats", "opacities", "sh0", "shN")}
    n = p["means"].shape[0]
    expected = {"means": (n, 3), "scales": (n, 3), "quats": (n, 4), "opacities": (n,), "sh0": (n, 1, 3)}
    for name, shape in expected.items():
        if p[name].shape != shape:
            raise ValueError(f"{name} has shape {p[name].shape}, expected {shape}")
    shn = p["shN"]
    if shn.ndim != 3 or shn.shape[0] != n or shn.shape[2] != 3 or shn.shape[1] not in _REST_PER_CHANNEL.values():
        raise ValueError(f"shN has shape {shn.shape}, expected ({n}, K-1, 3) with K-1 in 0, 3, 8, 15")
    degree = {rest: d for d, rest in _REST_PER_CHANNEL.items()}[shn.shape[1]]
    return p, degree


def write_ply(path: PathLike, params) -> None:
    """Write pre-activation Gaussian parameters (numpy or torch) as an INRIA .ply, atomically."""
    p, degree = checked_params(params)
    n = p["means"].shape[0]
    f_rest = p["shN"].transpose(0, 2, 1).reshape(n, -1)  # [N, 3, K-1]: channel-major
    columns = np.concatenate(
        [p["means"], np.zeros((n, 3), np.float32), p["sh0"].reshape(n, 3), f_rest,
         p["opacities"][:, None], p["scales"], p["quats"]],
        axis=1,
    )  # fmt: skip
    names = vertex_field_names(degree)
    assert columns.shape[1] == len(names)
    vertices = np.ascontiguousarray(columns, dtype="<f4").view([(name, "<f4") for name in names]).reshape(n)
    with atomic_path(path) as tmp:
        PlyData([PlyElement.describe(vertices, "vertex")], byte_order="<").write(str(tmp))


def write_points_ply(path: PathLike, xyz, rgb_uint8) -> None:
    """INRIA's input.ply: x y z nx ny nz (float32, zero normals) red green blue (uint8)."""
    xyz = _as_float32(xyz)
    rgb = np.asarray(rgb_uint8.detach().cpu().numpy() if hasattr(rgb_uint8, "detach") else rgb_uint8)
    if xyz.ndim != 2 or xyz.shape[1] != 3 or rgb.shape != xyz.shape:
        raise ValueError(f"xyz {xyz.shape} and rgb {rgb.shape} must both be [N, 3]")
    if rgb.dtype != np.uint8:
        raise ValueError(f"rgb must be uint8, got {rgb.dtype}")
    dtype = [(c, "<f4") for c in ("x", "y", "z", "nx", "ny", "nz")] + [(c, "u1") for c in ("red", "green", "blue")]
    vertices = np.zeros(xyz.shape[0], dtype=dtype)
    for i, c in enumerate("xyz"):
        vertices[c] = xyz[:, i]
    for i, c in enumerate(("red", "green", "blue")):
        vertices[c] = rgb[:, i]
    with atomic_path(path) as tmp:
        PlyData([PlyElement.describe(vertices, "vertex")], byte_order="<").write(str(tmp))


# --- reading ----------------------------------------------------------------------


def _bad(path: Path, problem: str) -> InputError:
    return InputError(f"bad .ply file {path}: {problem}")


def _read_vertex_layout(path: Path) -> Tuple[int, int, np.dtype]:
    """Parse the header: (bytes before the data, vertex count, vertex record dtype).

    Only a binary little-endian file whose first element is 'vertex' with scalar
    properties is accepted: that is what INRIA and every 3DGS tool write.
    """
    try:
        with open(path, "rb") as f:
            head = f.read(_MAX_HEADER_BYTES)
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror or e}") from e
    if head.split(b"\n", 1)[0].strip() != b"ply":
        raise _bad(path, "not a PLY file (the first line is not 'ply')")
    end = head.find(b"\nend_header")
    newline = head.find(b"\n", end + 1)
    if end < 0 or newline < 0:
        raise _bad(path, f"no 'end_header' line in the first {_MAX_HEADER_BYTES} bytes")
    lines = [line.strip() for line in head[:end].decode("ascii", errors="replace").splitlines()[1:]]

    fmt = None
    elements: List[Tuple[str, str, List[Tuple[str, str]]]] = []  # (name, count text, [(prop, dtype)])
    for line in lines:
        words = line.split()
        if not words or words[0] in ("comment", "obj_info"):
            continue
        if words[0] == "format":
            fmt = " ".join(words[1:])
        elif words[0] == "element" and len(words) == 3:
            elements.append((words[1], words[2], []))
        elif words[0] == "property" and elements and len(words) >= 3:
            if words[1] == "list":
                raise _bad(path, f"list property '{words[-1]}' in element '{elements[-1][0]}' is not supported")
            if len(words) != 3 or words[1] not in _PLY_SCALAR_TYPES:
                raise _bad(path, f"malformed header line '{line}'")
            elements[-1][2].append((words[2], _PLY_SCALAR_TYPES[words[1]]))
        else:
            raise _bad(path, f"malformed header line '{line}'")
    if fmt != "binary_little_endian 1.0":
        raise _bad(path, f"format is '{fmt}', only 'binary_little_endian 1.0' is supported")
    if not elements or elements[0][0] != "vertex":
        raise _bad(path, "the first element must be 'vertex'")
    _, count_text, props = elements[0]
    if not props:
        raise _bad(path, "the vertex element has no properties")
    if not count_text.isdigit():
        raise _bad(path, f"vertex count '{count_text}' is not a non-negative integer")
    names = [name for name, _ in props]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise _bad(path, f"duplicate vertex properties {duplicates}")
    return newline + 1, int(count_text), np.dtype([(name, "<" + t) for name, t in props])


def _read_vertices(path: Path) -> np.ndarray:
    header_bytes, count, dtype = _read_vertex_layout(path)
    available = os.path.getsize(path) - header_bytes
    if count * dtype.itemsize > available:
        raise _bad(
            path,
            f"header claims {count} vertices ({count * dtype.itemsize} bytes) "
            f"but only {available} bytes follow the header (truncated or corrupt)",
        )
    with open(path, "rb") as f:
        f.seek(header_bytes)
        vertices = np.fromfile(f, dtype=dtype, count=count)
    if vertices.shape[0] != count:
        raise _bad(path, f"could read only {vertices.shape[0]} of {count} vertices")
    return vertices


_F_REST = re.compile(r"f_rest_(\d+)$")


def read_ply(path: PathLike) -> Tuple[Params, int]:
    """Read an INRIA-layout .ply -> (pre-activation float32 params, SH degree).

    Raises InputError naming the file for anything that is not a sound Gaussian model.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"model file {path} does not exist")
    vertices = _read_vertices(path)
    present = set(vertices.dtype.names)
    n = vertices.shape[0]

    rest_indices = sorted(int(m.group(1)) for m in map(_F_REST.match, present) if m)
    if rest_indices != list(range(len(rest_indices))) or len(rest_indices) not in _DEGREE_OF_REST_FIELDS:
        raise _bad(
            path,
            f"found {len(rest_indices)} f_rest_* fields; a Gaussian model needs f_rest_0..M-1 "
            f"with M in {sorted(_DEGREE_OF_REST_FIELDS)} (SH degree 0..3)",
        )
    degree = _DEGREE_OF_REST_FIELDS[len(rest_indices)]
    wanted = [name for name in vertex_field_names(degree) if name not in ("nx", "ny", "nz")]
    missing = [name for name in wanted if name not in present]
    if missing:
        raise _bad(path, f"missing vertex properties {missing}")

    def column(*names: str) -> np.ndarray:
        out = np.empty((n, len(names)), dtype=np.float32)
        for i, name in enumerate(names):
            out[:, i] = vertices[name]
        finite = np.isfinite(out)
        if not finite.all():
            bad_col = int(np.argwhere(~finite)[0][1])
            count = int((~finite.all(axis=1)).sum())
            raise _bad(path, f"non-finite value (NaN or inf) in property '{names[bad_col]}' of {count} vertices")
        return out

    rest = _REST_PER_CHANNEL[degree]
    params = {
        "means": column("x", "y", "z"),
        "scales": column("scale_0", "scale_1", "scale_2"),
        "quats": column("rot_0", "rot_1", "rot_2", "rot_3"),
        "opacities": column("opacity")[:, 0],
        "sh0": column("f_dc_0", "f_dc_1", "f_dc_2").reshape(n, 1, 3),
        # channel-major in the file: [N, 3, K-1] -> [N, K-1, 3]
        "shN": column(*[f"f_rest_{i}" for i in range(3 * rest)]).reshape(n, 3, rest).transpose(0, 2, 1).copy(),
    }
    return params, degree
