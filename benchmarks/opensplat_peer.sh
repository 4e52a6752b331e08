#!/usr/bin/env bash
# OpenSplat (CPU build, against the pip torch's libtorch) as the peer of our 3dgs preset on
# one capture, one thread each, runs one after the other (issue 30).
#
#   benchmarks/opensplat_peer.sh SCENE [WORK] OPENSPLAT_SRC [SECONDS] [RES] [VAL_IMAGE]
#
#   SCENE          COLMAP capture (sparse/ + images/), e.g. test_colmap (see the README)
#   WORK           scratch folder: OpenSplat build, runs, JSON  default /tmp/opensplat_peer
#   OPENSPLAT_SRC  OpenSplat source tree, or a bare git dir (the `fetch` of pierotofy/OpenSplat,
#                  exported at HEAD; or a clone of github.com/pierotofy/OpenSplat)
#   SECONDS        wall time of the equal-time runs (about)     default 150
#   RES            downscale factor, the same for both          default 4
#   VAL_IMAGE      OpenSplat's one held-out image; pick one of our --eval test views
#                  (every 8th in name order, the first included) default: the second test view
#
# Needs: cmake, ninja, g++, the pip torch, and (Debian) libopencv-dev nlohmann-json3-dev
# libnanoflann-dev libcxxopts-dev. OpenSplat's CMakeLists FetchContent's json/nanoflann/cxxopts
# from GitHub; with no network to GitHub the build points FetchContent at empty shims and the
# system headers instead (no source patch).
#
# What it runs, in order, never two at once, OMP_NUM_THREADS=1 and --threads 1:
#   1. matched-count speed: both trainers 400 steps from the capture's SfM points, no growth
#      (OpenSplat densifies only after step 500; ours is capped with --max-gaussians);
#   2. equal wall time: OpenSplat with --num-iters sized from (1) to take about SECONDS, then ours
#      with --budget-seconds = OpenSplat's measured step-loop time, once free and once capped
#      (--max-gaussians) at OpenSplat's final Gaussian count, and our default preset (turbo) free;
#   3. quality: OpenSplat's run again with --val-render (deterministic: the same model), so that its
#      held-out view is scored from its own render; its .ply (written with --keep-crs, so in the
#      COLMAP frame) is also rendered by our renderer, as a cross-check. Ours: per_view.json.
# The figures go to WORK/summary.txt.
set -euo pipefail
USAGE="usage: $0 SCENE [WORK] OPENSPLAT_SRC [SECONDS] [RES] [VAL_IMAGE]"
SCENE=${1:?$USAGE}
WORK=${2:-/tmp/opensplat_peer}
SRC=${3:?$USAGE}
SECONDS_EQ=${4:-150}
RES=${5:-4}
VAL_IMAGE=${6:-}
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)

# --- 1. build OpenSplat (CPU) --------------------------------------------------------------
OS_SRC="$WORK/opensplat-src"
if [ ! -f "$OS_SRC/CMakeLists.txt" ]; then
  mkdir -p "$OS_SRC"
  if [ -f "$SRC/CMakeLists.txt" ]; then cp -r "$SRC"/. "$OS_SRC"/
  else git --git-dir="$SRC" archive HEAD | tar -x -C "$OS_SRC"; fi
fi
OS_COMMIT=$( (git --git-dir="$SRC" rev-parse HEAD 2>/dev/null) || echo unknown)
OS_BIN="$WORK/opensplat-build/opensplat"
if [ ! -x "$OS_BIN" ]; then
  for d in json:nlohmann_json:nlohmann_json nanoflann:nanoflann:nanoflann cxxopts:cxxopts:cxxopts; do
    IFS=: read -r dir lib ns <<<"$d"
    mkdir -p "$WORK/shims/$dir"
    printf 'add_library(%s INTERFACE)\nadd_library(%s::%s ALIAS %s)\n' "$lib" "$ns" "$lib" "$lib" \
      >"$WORK/shims/$dir/CMakeLists.txt"
  done
  cmake -S "$OS_SRC" -B "$WORK/opensplat-build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGPU_RUNTIME=CPU \
    -DCMAKE_PREFIX_PATH="$(python -c 'import torch; print(torch.utils.cmake_prefix_path)')" \
    -DFETCHCONTENT_FULLY_DISCONNECTED=ON \
    -DFETCHCONTENT_SOURCE_DIR_NLOHMANN_JSON="$WORK/shims/json" \
    -DFETCHCONTENT_SOURCE_DIR_NANOFLANN="$WORK/shims/nanoflann" \
    -DFETCHCONTENT_SOURCE_DIR_CXXOPTS="$WORK/shims/cxxopts"
  ninja -C "$WORK/opensplat-build" -j1 opensplat
fi

if [ -z "$VAL_IMAGE" ]; then
  VAL_IMAGE=$(ls "$SCENE/images" | sort | awk 'NR % 8 == 1' | sed -n 2p)
  [ -n "$VAL_IMAGE" ] || VAL_IMAGE=$(ls "$SCENE/images" | sort | head -1)
fi
NPTS=$(cd "$REPO" && python -c "
import glob, sys; from pathlib import Path; from turbogs.data import colmap
p = sorted(glob.glob(sys.argv[1] + '/sparse/**/points3D.bin', recursive=True))[0]
print(len(colmap.read_points3d_bin(Path(p))[0]))" "$SCENE")
echo "OpenSplat $OS_COMMIT; scene $SCENE at -r $RES; val image $VAL_IMAGE; $NPTS SfM points"

# the two helpers: OpenSplat under a stopwatch (a timestamp per "Step N" line, the Gaussian
# count from its "new count"/"remaining" lines), and its .ply rendered by our renderer
cat >"$WORK/run_opensplat.py" <<'PYEOF'
"""Run OpenSplat, timestamp each 'Step N' line, track the Gaussian count; write a JSON summary."""
import json, re, subprocess, sys, time
out_json, cmd = sys.argv[1], sys.argv[2:]
t0 = time.perf_counter()
p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
steps, counts, val, last = [], [], None, None
init = None
for line in p.stdout:
    now = time.perf_counter() - t0
    m = re.match(r"Step (\d+): ([0-9.eE+-]+)", line)
    if m:
        steps.append((int(m.group(1)), now)); continue
    m = re.search(r"new count (\d+)|remaining (\d+)", line)
    if m:
        counts.append((steps[-1][0] if steps else 0, now, int(m.group(1) or m.group(2))))
    if "validation loss" in line: val = line.strip()
    if "Reading" in line or "points" in line.lower(): pass
    sys.stdout.write(line)
rc = p.wait()
wall = time.perf_counter() - t0
s = {"rc": rc, "cmd": cmd, "wall_seconds": wall, "steps": steps[-1][0] if steps else 0,
     "first_step_at": steps[0][1] if steps else None, "last_step_at": steps[-1][1] if steps else None,
     "counts": counts, "validation": val}
if len(steps) > 1:
    # the step loop: from the line of step 1 (its first step is done) to the last step
    s["loop_seconds"] = steps[-1][1] - steps[0][1]
    s["steps_per_second"] = (steps[-1][0] - steps[0][0]) / s["loop_seconds"]
    def rate(a, b):
        pts = [(k, t) for k, t in steps if a <= k <= b]
        return (pts[-1][0] - pts[0][0]) / (pts[-1][1] - pts[0][1]) if len(pts) > 1 else None
    s["steps_per_second_by_window"] = {f"{a}-{b}": rate(a, b) for a, b in
        [(1, 500), (500, 1000), (1000, 2000), (2000, 4000), (4000, 8000), (8000, 16000), (16000, 30000)] if rate(a, b)}
json.dump(s, open(out_json, "w"), indent=1)
print(json.dumps({k: v for k, v in s.items() if k not in ("counts", "cmd")}))
PYEOF
cat >"$WORK/eval_ply.py" <<'PYEOF'
import json, sys
import torch
from turbogs.data.load import load_scene
from turbogs.evaluate import evaluate_views
from turbogs.formats.model_folder import load_gaussians
scene_dir, res, ply, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
torch.set_num_threads(1)
scene = load_scene(scene_dir, resolution=res, eval_split=True, log=lambda s: None)
g, _ = load_gaussians(ply, torch.device("cpu"))
res_all = {"num_gaussians": len(g)}
for name, bg in [("black", [0.0, 0.0, 0.0]), ("opensplat_bg", [0.6130, 0.0101, 0.3984])]:
    ev = evaluate_views(g, scene.test, torch.tensor(bg), log=lambda s: None, lpips_note=False)
    res_all[name] = ev["per_view"]
json.dump(res_all, open(out, "w"), indent=1)
print(json.dumps(res_all, indent=1))
PYEOF

# OpenSplat reads COLMAP's binaries from ROOT/ or ROOT/sparse/0/ only: a linked view of the capture
OS_SCENE="$WORK/scene"
SPARSE=$(dirname "$(find "$SCENE/sparse" -name cameras.bin | sort | head -1)")
mkdir -p "$OS_SCENE/sparse/0"
ln -sfn "$SCENE/images" "$OS_SCENE/images"
for f in cameras.bin images.bin points3D.bin; do ln -sfn "$SPARSE/$f" "$OS_SCENE/sparse/0/$f"; done

run_os() {  # json out, then opensplat args
  local out=$1; shift
  python "$WORK/run_opensplat.py" "$out" "$OS_BIN" "$OS_SCENE" --cpu -d "$RES" --num-downscales 0 \
    --val-image "$VAL_IMAGE" --val --keep-crs "$@" | grep -v '^Step ' || true
  python -c "import json, sys; sys.exit(json.load(open('$out'))['rc'])" || { echo "OpenSplat failed" >&2; exit 1; }
}
run_ours() {  # model folder, then turbogs train args (the 3dgs preset unless PRESET says otherwise)
  local out=$1; shift
  (cd "$REPO" && /usr/bin/time -v turbogs train "$SCENE" -r "$RES" --preset "${PRESET:-3dgs}" --eval --threads 1 \
    --overwrite -o "$out" --quiet "$@") 2>"$out.time" | tail -3
  python -c "import json; r=json.load(open('$out/results.json')); print({k: r.get(k) for k in ('steps','train_seconds','num_gaussians','backend','psnr')})"
}

# --- 2. matched count: 400 steps at the SfM points --------------------------------------------
run_os "$WORK/os_400.json" --num-iters 400 -o "$WORK/os_400/splat.ply"
run_ours "$WORK/ours_400" --steps 400 --max-gaussians "$NPTS"

# --- 3. equal wall time -------------------------------------------------------------------
RATE=$(python -c "import json; print(json.load(open('$WORK/os_400.json'))['steps_per_second'])")
# the model grows after step 500, so its steps slow down: ask for 60 % of the steps at the probe's pace
# a multiple of 10, so that --val-render (every 10 steps) renders the final model
ITERS=$(python -c "print(max(600, int(0.6 * $RATE * $SECONDS_EQ) // 10 * 10))")
mkdir -p "$WORK/os_eq" "$WORK/os_eq_vr"
run_os "$WORK/os_eq.json" --num-iters "$ITERS" -o "$WORK/os_eq/splat.ply"
BUDGET=$(python -c "import json; print(round(json.load(open('$WORK/os_eq.json'))['loop_seconds'], 1))")
NOS=$(python -c "import json; c=json.load(open('$WORK/os_eq.json'))['counts']; print(c[-1][2] if c else $NPTS)")
run_ours "$WORK/ours_eq" --budget-seconds "$BUDGET"
# ours capped at OpenSplat's final Gaussian count: the speed and PSNR at a similar count
run_ours "$WORK/ours_eq_cap" --budget-seconds "$BUDGET" --max-gaussians "$NOS"
# our default preset, which a user runs
PRESET=turbo run_ours "$WORK/ours_eq_turbo" --budget-seconds "$BUDGET"
# OpenSplat's quality by its own renderer: the same run again (it is deterministic: the same
# validation loss), rendering its held-out view every 10 steps (slower: not used for speed)
run_os "$WORK/os_eq_vr.json" --num-iters "$ITERS" -o "$WORK/os_eq_vr/splat.ply" --val-render "$WORK/os_eq_vr/render"
# and its final .ply rendered by our renderer (a cross-check: the two renderers differ on its model)
(cd "$REPO" && python "$WORK/eval_ply.py" "$SCENE" "$RES" "$WORK/os_eq/splat.ply" "$WORK/os_eq_eval.json" >/dev/null)

# --- 4. summary -----------------------------------------------------------------------------
cat >"$WORK/summary.py" <<'PYEOF'
import json, sys
import numpy as np, torch
from PIL import Image
from turbogs.data.load import load_scene
from turbogs.metrics import psnr
w, val, scene, res, iters = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
j = lambda p: json.load(open(f"{w}/{p}"))
o4, u4, oe, ue, uc = j("os_400.json"), j("ours_400/results.json"), j("os_eq.json"), j("ours_eq/results.json"), j("ours_eq_cap/results.json")
ut = j("ours_eq_turbo/results.json")
ev = j("os_eq_eval.json")
r_o4, r_u4 = o4["steps_per_second"], u4["steps"] / u4["train_seconds"]
r_oe = oe["steps_per_second"]
n_oe = oe["counts"][-1][2] if oe["counts"] else None
key = val
cam = next(c for c in load_scene(scene, resolution=res, eval_split=True, log=lambda s: None).test if c.name == key)
own = torch.from_numpy(np.asarray(Image.open(f"{w}/os_eq_vr/render/{iters // 10 * 10}.png").convert("RGB"), dtype=np.float32) / 255)
print(f"400 steps at the SfM points ({u4['num_gaussians']} Gaussians): OpenSplat {r_o4:.2f} steps/s, ours {r_u4:.2f} steps/s "
      f"(backend {u4.get('backend')}): ours/OpenSplat {r_u4 / r_o4:.2f}x")
print(f"equal time {oe['loop_seconds']:.0f} s: OpenSplat {oe['steps']} steps, {r_oe:.2f} steps/s, {n_oe} Gaussians at the end")
for name, u in (("ours", ue), ("ours capped", uc), ("ours, turbo", ut)):
    print(f"  {name}: {u['steps']} steps in {u['train_seconds']:.0f} s, {u['steps'] / u['train_seconds']:.2f} steps/s, "
          f"{u['num_gaussians']} Gaussians: {u['steps'] / u['train_seconds'] / r_oe:.2f}x OpenSplat's steps/s")
print(f"PSNR on {key} (OpenSplat's held-out view, one of our test views):")
print(f"  ours {j('ours_eq/per_view.json')[key]['psnr']:.2f} dB, ours capped {j('ours_eq_cap/per_view.json')[key]['psnr']:.2f} dB, "
      f"ours turbo {j('ours_eq_turbo/per_view.json')[key]['psnr']:.2f} dB")
print(f"  OpenSplat by its own renderer {psnr(own, cam.image):.2f} dB (its render PNG, 8 bit); {oe['validation']}")
print(f"  OpenSplat's .ply by our renderer {ev['black'][key]['psnr']:.2f} dB on black, {ev['opensplat_bg'][key]['psnr']:.2f} dB on its background")
print(f"ours, mean of our {ue['num_test_views']} test views: {ue['psnr']:.2f} dB (capped {uc['psnr']:.2f} dB, turbo {ut['psnr']:.2f} dB)")
PYEOF
(cd "$REPO" && python "$WORK/summary.py" "$WORK" "$VAL_IMAGE" "$SCENE" "$RES" "$ITERS") | tee "$WORK/summary.txt"
