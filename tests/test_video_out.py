"""`turbogs render --path ... --video out.mp4` writes H.264 (yuv420p) through imageio-ffmpeg: the stream is
read back by ffmpeg itself (codec, chroma layout, frame count, pixels against the PNG frames), Chromium
plays it in a page, and without imageio-ffmpeg the mp4v fallback is written and announced in one line."""

import json

import cv2
import numpy as np
import pytest
from browser import chromium_page, require_browser
from test_exports import run_cli, small_model

from turbogs.render import mp4

imageio_ffmpeg = pytest.importorskip("imageio_ffmpeg", reason='imageio-ffmpeg is in the capture extra: pip install -e ".[capture]"')


def read_back(path):
    """(ffmpeg's description of the stream, the frames as uint8 RGB), decoded by imageio-ffmpeg's ffmpeg."""
    reader = imageio_ffmpeg.read_frames(str(path))
    meta = next(reader)
    w, h = meta["size"]
    frames = [np.frombuffer(f, np.uint8).reshape(h, w, 3) for f in reader]
    return meta, frames


@pytest.fixture(scope="module")
def orbit(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("video")
    model, _ = small_model(tmp_path / "model")
    video, frames = tmp_path / "orbit.mp4", tmp_path / "frames"
    from turbogs.cli import main
    assert main([str(a) for a in ("render", model, "--path", "orbit", "--video", video, "--frames", 12, "--fps", 12,
                                  "--width", 100, "--frames-dir", frames)]) == 0
    return video, sorted(frames.glob("frame_*.png"))


def test_the_video_is_h264_yuv420p_with_the_rendered_frames(orbit):
    video, pngs = orbit
    meta, frames = read_back(video)
    assert meta["codec"].startswith("h264") and meta["pix_fmt"].startswith("yuv420p"), meta
    assert tuple(meta["size"]) == (100, 76) and abs(meta["fps"] - 12) < 1e-3
    assert len(frames) == len(pngs) == 12
    for frame, png in zip(frames, pngs):
        truth = cv2.cvtColor(cv2.imread(str(png)), cv2.COLOR_BGR2RGB).astype(float)
        assert np.abs(frame - truth).mean() < 3  # H.264 at CRF 18: the same picture
    # the index is at the front (+faststart): a browser starts playing before the whole file is in
    head = video.read_bytes()[:4096]
    assert head.find(b"moov") != -1 and head.find(b"moov") < max(head.find(b"mdat"), 4096)


def test_the_frames_are_not_mirrored_or_channel_swapped(tmp_path):
    """A red-left, blue-right frame comes back as it went in."""
    frame = np.zeros((16, 32, 3), np.uint8)
    frame[:, :16, 0] = 220
    frame[:, 16:, 2] = 220
    writer = mp4.open_mp4(tmp_path / "a.mp4", (32, 16), 10)
    for _ in range(3):
        writer.write(frame)
    writer.close()
    _, frames = read_back(tmp_path / "a.mp4")
    assert len(frames) == 3 and np.abs(frames[1].astype(float) - frame).mean() < 8


def test_without_imageio_ffmpeg_it_writes_mp4v_and_says_so(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(mp4, "h264_available", lambda: False)
    model, _ = small_model(tmp_path / "model")
    code, out, err = run_cli(capsys, "render", model, "--path", "orbit", "--video", tmp_path / "v.mp4", "--frames", 4,
                             "--width", 64)
    assert code == 0, err
    notes = [line for line in out.splitlines() if "imageio-ffmpeg is not installed" in line]
    assert len(notes) == 1 and "pip install" in notes[0] and "(mp4v)" in out
    meta, frames = read_back(tmp_path / "v.mp4")
    assert meta["codec"].startswith("mpeg4") and len(frames) == 4, meta  # MPEG-4 Part 2


def play_in_chromium(video):
    """What a page's <video> makes of the file: 'played' (time advanced), 'error' or 'timeout',
    with the duration and width it reported."""
    page_file = video.parent / f"{video.stem}.html"
    page_file.write_text(f'<video id="v" src="{video.name}" muted playsinline></video>')
    with chromium_page(320, 240) as page:
        page.goto(page_file.as_uri())
        return page.evaluate("""() => new Promise(resolve => {
            const v = document.getElementById('v');
            const report = (how) => resolve({how, duration: v.duration, error: v.error && v.error.code,
                                             width: v.videoWidth, time: v.currentTime});
            v.addEventListener('timeupdate', () => { if (v.currentTime > 0) report('played'); });
            const play = () => v.play().catch((e) => report('play refused: ' + e));
            v.addEventListener('error', () => report('error'));
            if (v.error) report('error');
            else if (v.readyState >= 1) play();  // the metadata came in before this script ran
            else v.addEventListener('loadedmetadata', play);
            setTimeout(() => report('timeout'), 15000);
        })""")


def test_chromium_plays_the_video(orbit):
    """The point of H.264: a browser's <video> loads it, reports its duration and plays it."""
    require_browser()
    state = play_in_chromium(orbit[0])
    assert state["how"] == "played", json.dumps(state)
    assert abs(state["duration"] - 1.0) < 0.05 and state["width"] == 100 and state["time"] > 0, state


def test_chromium_refuses_the_mp4v_fallback(tmp_path):
    """The page above is a real check: the same page cannot play OpenCV's MPEG-4 Part 2."""
    require_browser()
    writer = mp4.Mp4vWriter(tmp_path / "old.mp4", (100, 76), 12)
    for i in range(12):
        writer.write(np.full((76, 100, 3), 20 * i, np.uint8))
    writer.close()
    state = play_in_chromium(tmp_path / "old.mp4")
    assert state["how"] == "error" and state["error"] == 4, state  # MEDIA_ERR_SRC_NOT_SUPPORTED
