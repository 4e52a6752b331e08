import json
import os
import stat

import pytest

from turbogs.errors import TurboGSError
from turbogs.fileio import atomic_path, atomic_write_bytes, atomic_write_json, atomic_write_text


def test_writers_round_trip(tmp_path):
    atomic_write_bytes(tmp_path / "a.bin", b"\x00\x01\xff")
    atomic_write_text(tmp_path / "b.txt", "héllo\n")
    atomic_write_json(tmp_path / "c.json", {"psnr": 27.5, "steps": [1, 2]})
    assert (tmp_path / "a.bin").read_bytes() == b"\x00\x01\xff"
    assert (tmp_path / "b.txt").read_text(encoding="utf-8") == "héllo\n"
    assert json.loads((tmp_path / "c.json").read_text()) == {"psnr": 27.5, "steps": [1, 2]}
    assert sorted(os.listdir(tmp_path)) == ["a.bin", "b.txt", "c.json"]


def test_overwrite_replaces_old_content(tmp_path):
    target = tmp_path / "x.txt"
    atomic_write_text(target, "old")
    atomic_write_text(target, "new")
    assert target.read_text() == "new"
    assert os.listdir(tmp_path) == ["x.txt"]


def test_failure_mid_write_keeps_old_file_and_no_temp(tmp_path):
    target = tmp_path / "model.ply"
    target.write_bytes(b"old contents")
    with pytest.raises(RuntimeError, match="killed"):
        with atomic_path(target) as tmp:
            with open(tmp, "wb") as f:
                f.write(b"half of the new")
            raise RuntimeError("killed mid-write")
    assert target.read_bytes() == b"old contents"
    assert os.listdir(tmp_path) == ["model.ply"]


def test_unserializable_json_touches_nothing(tmp_path):
    target = tmp_path / "m.json"
    target.write_text("{}")
    with pytest.raises(TypeError):
        atomic_write_json(target, {"bad": object()})
    assert target.read_text() == "{}"
    assert os.listdir(tmp_path) == ["m.json"]


def test_temp_path_keeps_suffix_and_lives_in_target_folder(tmp_path):
    target = tmp_path / "render.png"
    with atomic_path(target) as tmp:
        assert tmp.suffix == ".png"
        assert tmp.parent == tmp_path
        assert tmp != target
        tmp.write_bytes(b"png bytes")
        assert not target.exists()  # nothing visible until the block succeeds
    assert target.read_bytes() == b"png bytes"
    assert os.listdir(tmp_path) == ["render.png"]


def test_os_error_inside_block_becomes_one_line_error_and_cleans_up(tmp_path):
    target = tmp_path / "ckpt.pt"
    with pytest.raises(TurboGSError, match="ckpt.pt"):
        with atomic_path(target) as tmp:
            tmp.write_bytes(b"partial")
            raise OSError(28, "No space left on device")
    assert os.listdir(tmp_path) == []


def test_missing_folder_is_a_turbogs_error_naming_the_path(tmp_path):
    target = tmp_path / "no" / "such" / "dir" / "out.json"
    with pytest.raises(TurboGSError, match=str(target.name)) as info:
        atomic_write_json(target, {})
    assert "\n" not in str(info.value)


def test_file_mode_matches_a_plain_open(tmp_path):
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    atomic_write_text(tmp_path / "atomic.txt", "x")
    assert stat.S_IMODE(os.stat(tmp_path / "atomic.txt").st_mode) == stat.S_IMODE(os.stat(plain).st_mode)
