"""Fuzzed readers: a mutated COLMAP, transforms.json or .ply file either loads or raises
`TurboGSError` (what the CLI turns into one line and exit code 2) - never any other
exception, which would reach the user as a traceback.

The valid seed files and the mutators are shared with benchmarks/fuzz_long.py (the long,
counted run); hypothesis picks the file, the mutation seed and replays failures. Also:
headers that claim absurd record counts are refused before anything is allocated.
"""

import importlib.util
import random
import struct
import tracemalloc
import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from turbogs.data import colmap
from turbogs.errors import InputError, TurboGSError
from turbogs.formats.ply import read_ply

_spec = importlib.util.spec_from_file_location(
    "fuzz_long", Path(__file__).resolve().parents[1] / "benchmarks" / "fuzz_long.py")
fuzz = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fuzz)

EXAMPLES = 200


@pytest.fixture(scope="module")
def seeds(tmp_path_factory):
    return fuzz.write_seeds(tmp_path_factory.mktemp("seeds"))


@pytest.mark.parametrize("reader", sorted(fuzz.READERS))
def test_seed_files_load(reader, seeds, tmp_path):
    """The fuzzing starts from valid files: unmutated, every reader loads them."""
    for name, data in seeds[reader].items():
        folder = tmp_path / name
        fuzz.prepare(seeds, reader, folder, name, data)
        assert fuzz.run_one(reader, folder) == ("ok", "")


def test_mutators_change_the_bytes(seeds):
    data = seeds["colmap_txt"]["images.txt"]
    rng = random.Random(0)
    for mutator in fuzz.MUTATORS:
        assert any(mutator(data, rng) != data for _ in range(5)), mutator.__name__


def test_run_one_tells_other_exceptions_apart(tmp_path, monkeypatch):
    """The classifier itself: a ValueError must count as 'other', an InputError as 'error'."""
    def broken(folder):
        raise ValueError("a bug")

    def refusing(folder):
        raise InputError("bad file")

    monkeypatch.setitem(fuzz.READERS, "broken", broken)
    monkeypatch.setitem(fuzz.READERS, "refusing", refusing)
    assert fuzz.run_one("broken", tmp_path)[0] == "other"
    assert fuzz.run_one("refusing", tmp_path) == ("error", "")


@pytest.mark.parametrize("reader", sorted(fuzz.READERS))
def test_mutated_files_load_or_raise_turbogs_error(reader, seeds, tmp_path_factory):
    folder = tmp_path_factory.mktemp(reader)

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(file_name=st.sampled_from(sorted(seeds[reader])), seed=st.integers(0, 2**32 - 1))
    def check(file_name, seed):
        data = fuzz.mutate(seeds[reader][file_name], random.Random(seed))
        fuzz.prepare(seeds, reader, folder, file_name, data)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # numpy overflow warnings on extreme values
            outcome, text = fuzz.run_one(reader, folder)
        assert outcome in ("ok", "error"), text

    check()


# --- absurd counts are refused before allocation -------------------------------------------


def peak_bytes_while(call) -> int:
    tracemalloc.start()
    try:
        with pytest.raises(TurboGSError):
            call()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_ply_claiming_a_trillion_vertices(tmp_path):
    header = b"ply\nformat binary_little_endian 1.0\nelement vertex 1000000000000\nproperty float x\nend_header\n"
    path = tmp_path / "huge.ply"
    path.write_bytes(header + bytes(100 - len(header)))
    assert path.stat().st_size == 100
    peak = peak_bytes_while(lambda: read_ply(path))
    assert peak < 1 << 20, peak


@pytest.mark.parametrize("name, record_bytes", [("cameras.bin", 24), ("images.bin", 69), ("points3D.bin", 51)])
def test_colmap_bin_claiming_2_to_the_60_records(tmp_path, name, record_bytes):
    path = tmp_path / name
    path.write_bytes(struct.pack("<Q", 2**60) + bytes(3 * record_bytes))
    reader = {"cameras.bin": colmap.read_cameras_bin, "images.bin": colmap.read_images_bin,
              "points3D.bin": colmap.read_points3d_bin}[name]
    peak = peak_bytes_while(lambda: reader(path))
    assert peak < 1 << 20, peak


def test_points_txt_color_beyond_int64(tmp_path):
    """Found by the fuzzer: a 23-digit color overflowed numpy instead of being refused."""
    path = tmp_path / "points3D.txt"
    path.write_text("1 0.0 0.0 0.0 99999999999999999999999 0 0 0.5\n")
    with pytest.raises(InputError, match="0..255"):
        colmap.read_points3d_txt(path)


def test_transforms_integer_beyond_float_range(tmp_path):
    """Found by the fuzzer: JSON integers are unbounded, float() of 10**400 overflows."""
    from turbogs.data.transforms import read_nerfstudio

    big = "1" + "0" * 400
    (tmp_path / "transforms.json").write_text(
        '{"fl_x": %s, "frames": [{"file_path": "a.png", "transform_matrix": [[1,0,0,0],[0,1,0,0],[0,0,1,0],[0,0,0,1]]}]}'
        % big)
    with pytest.raises(InputError, match="fl_x"):
        read_nerfstudio(tmp_path)
    (tmp_path / "transforms.json").write_text(
        '{"fl_x": 50, "frames": [{"file_path": "a.png", "transform_matrix": [[%s,0,0,0],[0,1,0,0],[0,0,1,0],[0,0,0,1]]}]}'
        % big)
    with pytest.raises(InputError, match="transform_matrix"):
        read_nerfstudio(tmp_path)


def test_file_path_too_long_for_the_os_is_a_missing_image(tmp_path):
    """Found by the fuzzer: a 5000-character file_path made stat() raise ENAMETOOLONG."""
    from turbogs.data.transforms import read_nerfstudio

    (tmp_path / "transforms.json").write_text(
        '{"fl_x": 50, "frames": [{"file_path": "%s", "transform_matrix": [[1,0,0,0],[0,1,0,0],[0,0,1,0],[0,0,0,1]]}]}'
        % ("a" * 5000))
    frames, _ = read_nerfstudio(tmp_path)
    assert frames.views == [] and frames.missing == ["a" * 5000]
