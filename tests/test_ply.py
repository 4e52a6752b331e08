import math
import os
import time
import tracemalloc

import numpy as np
import pytest
import torch
from plyfile import PlyData

from turbogs.errors import InputError
from turbogs.formats.ply import read_ply, write_ply, write_points_ply
from turbogs.formats.splat import write_splat

REST_PER_CHANNEL = {0: 0, 1: 3, 2: 8, 3: 15}


def random_params(n, degree, seed=0):
    rng = np.random.default_rng(seed)
    rest = REST_PER_CHANNEL[degree]
    return {
        "means": rng.normal(size=(n, 3)).astype(np.float32),
        "scales": rng.normal(-3, 1, size=(n, 3)).astype(np.float32),
        "quats": rng.normal(size=(n, 4)).astype(np.float32),
        "opacities": rng.normal(size=n).astype(np.float32),
        "sh0": rng.normal(size=(n, 1, 3)).astype(np.float32),
        "shN": rng.normal(size=(n, rest, 3)).astype(np.float32),
    }


def header_of(path):
    raw = open(path, "rb").read()
    end = raw.index(b"end_header\n") + len(b"end_header\n")
    return raw[:end].decode("ascii"), raw[end:]


# --- round trip and layout ------------------------------------------------------


@pytest.mark.parametrize("degree", [0, 1, 2, 3])
def test_round_trip_is_exact(tmp_path, degree):
    params = random_params(7, degree, seed=degree)
    path = tmp_path / "m.ply"
    write_ply(path, params)
    back, back_degree = read_ply(path)
    assert back_degree == degree
    assert set(back) == set(params)
    for name in params:
        assert back[name].dtype == np.float32
        assert back[name].shape == params[name].shape, name
        np.testing.assert_array_equal(back[name], params[name], err_msg=name)


def test_accepts_torch_tensors(tmp_path):
    params = random_params(4, 1)
    write_ply(tmp_path / "t.ply", {k: torch.from_numpy(v).requires_grad_() for k, v in params.items()})
    back, _ = read_ply(tmp_path / "t.ply")
    np.testing.assert_array_equal(back["shN"], params["shN"])


def test_header_fields_are_exactly_inria_order(tmp_path):
    write_ply(tmp_path / "m.ply", random_params(5, 1))
    header, body = header_of(tmp_path / "m.ply")
    fields = (
        "x y z nx ny nz f_dc_0 f_dc_1 f_dc_2 "
        "f_rest_0 f_rest_1 f_rest_2 f_rest_3 f_rest_4 f_rest_5 f_rest_6 f_rest_7 f_rest_8 "
        "opacity scale_0 scale_1 scale_2 rot_0 rot_1 rot_2 rot_3"
    ).split()
    expected = ["ply", "format binary_little_endian 1.0", "element vertex 5"]
    expected += [f"property float {f}" for f in fields] + ["end_header"]
    assert header.splitlines() == expected
    assert len(body) == 5 * len(fields) * 4  # nothing else after the vertices


def test_degree3_has_45_rest_fields_and_62_in_all(tmp_path):
    write_ply(tmp_path / "m.ply", random_params(2, 3))
    names = [p.name for p in PlyData.read(str(tmp_path / "m.ply"))["vertex"].properties]
    assert len(names) == 62
    assert names[9:54] == [f"f_rest_{i}" for i in range(45)]
    assert names[54] == "opacity"


def test_channel_major_values_in_raw_file(tmp_path):
    """Read the bytes with plain numpy and check every column against a hand-built table."""
    n, rest = 3, 8  # degree 2
    params = random_params(n, 2)
    # shN[i, k, c] encodes (i, k, c) so a wrong ordering cannot go unnoticed
    params["shN"] = np.array(
        [[[100 * i + 10 * k + c for c in range(3)] for k in range(rest)] for i in range(n)], np.float32
    )
    write_ply(tmp_path / "m.ply", params)
    _, body = header_of(tmp_path / "m.ply")
    table = np.frombuffer(body, dtype="<f4").reshape(n, 9 + 24 + 8)
    for i in range(n):
        row = [*params["means"][i], 0.0, 0.0, 0.0, *params["sh0"][i, 0]]
        for c in range(3):  # all of red, then green, then blue
            for k in range(rest):
                row.append(100 * i + 10 * k + c)
        row += [params["opacities"][i], *params["scales"][i], *params["quats"][i]]
        np.testing.assert_array_equal(table[i], np.array(row, np.float32))
    vertex = PlyData.read(str(tmp_path / "m.ply"))["vertex"]
    assert vertex["f_rest_9"][2] == 100 * 2 + 10 * 1 + 1  # index c*(K-1)+k = 1*8+1 -> green, k=1


# --- bad files ------------------------------------------------------------------


def raw_ply(path, fields, count, body, fmt="binary_little_endian 1.0", ftype="float"):
    header = f"ply\nformat {fmt}\nelement vertex {count}\n"
    header += "".join(f"property {ftype} {f}\n" for f in fields) + "end_header\n"
    path.write_bytes(header.encode("ascii") + body)
    return path


INRIA_D0 = "x y z nx ny nz f_dc_0 f_dc_1 f_dc_2 opacity scale_0 scale_1 scale_2 rot_0 rot_1 rot_2 rot_3".split()


def test_hand_made_file_reads(tmp_path):
    """Guards the helper below: a correct hand-made file is accepted."""
    body = np.arange(2 * 17, dtype="<f4").tobytes()
    params, degree = read_ply(raw_ply(tmp_path / "ok.ply", INRIA_D0, 2, body))
    assert degree == 0
    np.testing.assert_array_equal(params["means"][1], [17, 18, 19])
    np.testing.assert_array_equal(params["quats"][0], [13, 14, 15, 16])
    assert params["opacities"][1] == 17 + 9


def assert_refused(path, *words):
    with pytest.raises(InputError) as info:
        read_ply(path)
    message = str(info.value)
    assert path.name in message
    assert "\n" not in message
    for word in words:
        assert word in message, message


def test_not_a_ply(tmp_path):
    path = tmp_path / "notes.ply"
    path.write_text("hello world\n")
    assert_refused(path, "not a PLY")


def test_no_end_header(tmp_path):
    path = tmp_path / "cut.ply"
    path.write_bytes(b"ply\nformat binary_little_endian 1.0\nelement vertex 3\nproperty float x\n")
    assert_refused(path, "end_header")


@pytest.mark.parametrize(
    "header",
    [
        b"ply\nformat binary_little_endian 1.0\nelement vertex 1\nproperty\nend_header\n",
        b"ply\nformat binary_little_endian 1.0\nproperty float x\nelement vertex 1\nend_header\n",
        b"ply\nformat binary_little_endian 1.0\nelement vertex 1\nproperty float128 x\nend_header\n",
        b"ply\nformat binary_little_endian 1.0\nelement vertex many\nproperty float x\nend_header\n",
        b"ply\nformat binary_little_endian 1.0\nelement vertex 1\nproperty float x\nproperty float x\nend_header\n",
        b"ply\nformat binary_little_endian 1.0\nelement face 1\nproperty float x\nend_header\n",
        b"ply\nformat binary_little_endian 1.0\nelement vertex 1\nproperty list uchar int i\nend_header\n",
    ],
)
def test_malformed_headers(tmp_path, header):
    path = tmp_path / "h.ply"
    path.write_bytes(header + bytes(64))
    assert_refused(path)


def test_vertex_without_properties_refused_quickly(tmp_path):
    path = tmp_path / "empty_props.ply"
    path.write_bytes(b"ply\nformat binary_little_endian 1.0\nelement vertex 1000000000000\nend_header\n")
    assert_refused(path, "no properties")


def test_ascii_format_refused(tmp_path):
    assert_refused(raw_ply(tmp_path / "a.ply", INRIA_D0, 0, b"", fmt="ascii 1.0"), "ascii")


def test_missing_fields(tmp_path):
    fields = [f for f in INRIA_D0 if f not in ("opacity", "rot_3")]
    path = raw_ply(tmp_path / "m.ply", fields, 1, np.zeros(len(fields), "<f4").tobytes())
    assert_refused(path, "opacity", "rot_3")


def test_points_only_ply_is_not_a_model(tmp_path):
    write_points_ply(tmp_path / "points.ply", np.zeros((3, 3)), np.zeros((3, 3), np.uint8))
    assert_refused(tmp_path / "points.ply", "missing")


@pytest.mark.parametrize("num_rest", [1, 10, 44, 46])
def test_wrong_f_rest_count(tmp_path, num_rest):
    fields = INRIA_D0[:9] + [f"f_rest_{i}" for i in range(num_rest)] + INRIA_D0[9:]
    path = raw_ply(tmp_path / "r.ply", fields, 1, np.zeros(len(fields), "<f4").tobytes())
    assert_refused(path, "f_rest", str(num_rest))


def test_f_rest_with_a_gap(tmp_path):
    fields = INRIA_D0[:9] + [f"f_rest_{i}" for i in range(10) if i != 4] + INRIA_D0[9:]
    path = raw_ply(tmp_path / "g.ply", fields, 1, np.zeros(len(fields), "<f4").tobytes())
    assert_refused(path, "f_rest")


def test_count_larger_than_file(tmp_path):
    path = raw_ply(tmp_path / "short.ply", INRIA_D0, 5, np.zeros(4 * 17, "<f4").tobytes())
    assert_refused(path, "5 vertices")


def test_huge_count_refused_without_allocating(tmp_path):
    path = raw_ply(tmp_path / "huge.ply", ["x", "y", "z"], 10**12, b"\0" * 16)
    tracemalloc.start()
    start = time.perf_counter()
    try:
        assert_refused(path, str(10**12))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 10 * 2**20
    assert time.perf_counter() - start < 1.0


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_values(tmp_path, bad):
    values = np.ones((3, 17), "<f4")
    values[1, 9] = bad  # opacity of the second Gaussian
    path = raw_ply(tmp_path / "nan.ply", INRIA_D0, 3, values.tobytes())
    assert_refused(path, "opacity", "NaN")


def test_missing_file(tmp_path):
    with pytest.raises(InputError, match="nope.ply"):
        read_ply(tmp_path / "nope.ply")


def test_double_fields_are_read_as_float32(tmp_path):
    body = np.arange(17, dtype="<f8").tobytes()
    params, _ = read_ply(raw_ply(tmp_path / "d.ply", INRIA_D0, 1, body, ftype="double"))
    assert params["scales"].dtype == np.float32
    np.testing.assert_array_equal(params["scales"][0], [10, 11, 12])


def test_write_rejects_bad_shapes_and_leaves_nothing(tmp_path):
    params = random_params(3, 1)
    params["shN"] = params["shN"][:, :2]
    with pytest.raises(ValueError, match="shN"):
        write_ply(tmp_path / "x.ply", params)
    assert os.listdir(tmp_path) == []


# --- input point cloud ----------------------------------------------------------


def test_points_ply_layout(tmp_path):
    rng = np.random.default_rng(3)
    xyz = rng.normal(size=(6, 3))
    rgb = rng.integers(0, 256, size=(6, 3), dtype=np.uint8)
    write_points_ply(tmp_path / "input.ply", xyz, rgb)
    header, body = header_of(tmp_path / "input.ply")
    assert header.splitlines() == [
        "ply", "format binary_little_endian 1.0", "element vertex 6",
        "property float x", "property float y", "property float z",
        "property float nx", "property float ny", "property float nz",
        "property uchar red", "property uchar green", "property uchar blue", "end_header",
    ]  # fmt: skip
    rows = np.frombuffer(body, dtype=[("xyz", "<f4", 3), ("n", "<f4", 3), ("rgb", "u1", 3)])
    np.testing.assert_array_equal(rows["xyz"], xyz.astype(np.float32))
    np.testing.assert_array_equal(rows["n"], 0)
    np.testing.assert_array_equal(rows["rgb"], rgb)


def test_points_ply_rejects_float_colors(tmp_path):
    with pytest.raises(ValueError, match="uint8"):
        write_points_ply(tmp_path / "p.ply", np.zeros((2, 3)), np.zeros((2, 3)))


# --- .splat -----------------------------------------------------------------------


def reference_splat_rows(params):
    """A per-Gaussian loop written from the format description, in plain Python math."""
    rows = []
    for i in range(params["means"].shape[0]):
        s = [float(v) for v in params["scales"][i]]
        o = float(params["opacities"][i])
        q = [float(v) for v in params["quats"][i]]
        norm = math.sqrt(sum(v * v for v in q))
        alpha = 1 / (1 + math.exp(-o))
        rgb = [0.5 + 0.28209479177387814 * float(v) for v in params["sh0"][i, 0]]
        rows.append(
            dict(
                key=-math.exp(sum(s)) * alpha,
                position=[float(v) for v in params["means"][i]],
                scale=[math.exp(v) for v in s],
                rgba=[int(min(max(c * 255, 0), 255)) for c in rgb + [alpha]],
                rot=[int(min(max(v / norm * 128 + 128, 0), 255)) for v in q],
            )
        )
    rows.sort(key=lambda r: r["key"])
    return rows


def test_splat_bytes_decode_to_reference(tmp_path):
    params = random_params(20, 2, seed=5)
    params["sh0"][0, 0] = [5.0, -5.0, 0.0]  # colors outside [0, 1] must clamp
    params["quats"][1] = [0.0, 0.0, 0.0, -2.0]  # the -1 component maps to 0
    write_splat(tmp_path / "m.splat", params)
    raw = (tmp_path / "m.splat").read_bytes()
    assert len(raw) == 32 * 20
    dtype = np.dtype([("pos", "<f4", (3,)), ("scale", "<f4", (3,)), ("rgba", "u1", (4,)), ("rot", "u1", (4,))])
    assert dtype.itemsize == 32
    got = np.frombuffer(raw, dtype=dtype)
    for record, expected in zip(got, reference_splat_rows(params)):
        np.testing.assert_array_equal(record["pos"], np.array(expected["position"], np.float32))
        np.testing.assert_allclose(record["scale"], expected["scale"], rtol=1e-6)
        np.testing.assert_array_equal(record["rgba"], expected["rgba"])
        np.testing.assert_array_equal(record["rot"], expected["rot"])
    clamped = got[np.all(got["pos"] == params["means"][0], axis=1)][0]
    assert list(clamped["rgba"][:3]) == [255, 0, 127]
    turned = got[np.all(got["pos"] == params["means"][1], axis=1)][0]
    assert list(turned["rot"]) == [128, 128, 128, 0]


def test_splat_order_is_biggest_most_opaque_first(tmp_path):
    params = random_params(3, 0)
    params["scales"][:] = np.log([[1.0, 1, 1], [2, 2, 2], [3, 3, 3]])
    params["opacities"][:] = [10.0, 10.0, -10.0]  # the biggest one is nearly transparent
    write_splat(tmp_path / "o.splat", params)
    got = np.frombuffer((tmp_path / "o.splat").read_bytes(), dtype="<f4").reshape(3, 8)
    np.testing.assert_allclose(got[:, 3], [2.0, 1.0, 3.0], rtol=1e-6)
