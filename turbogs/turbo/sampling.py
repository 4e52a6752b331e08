"""Tile-wise error-guided sparse pixel sampling.

`ErrorMemory` remembers, for every (training view, 16x16 tile), how wrong the last renders
of that tile were. `TileSampler` reads it each step to choose one view and the tiles of
that view to render: tiles that are still wrong are likely, well-reconstructed ones are
mostly skipped, and a floor keeps every view and tile alive.

A step of the trainer:

    sample = sampler.sample(progress)                   # progress in [0, 1] of the run
    camera = scene.train[sample.view]
    out = render(gaussians, camera, tile_mask=sample.tile_mask)
    loss, tile_errors = tile_loss(out.image, camera.image, sample.tile_ids, camera.mask)
    loss.backward()
    memory.update(sample.view, sample.tile_ids, tile_errors)

Views may differ in size: the memory is one [V, T_max] tensor plus each view's tile grid;
see `ErrorMemory`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from turbogs import host_read, kernels
from turbogs.errors import TurboGSError
from turbogs.tiles import TILE_SIZE, tile_grid


@dataclass
class SamplerConfig:
    tile_size: int = TILE_SIZE  # fixed: the renderer's tiles (the Trainer checks)
    gamma: float = 1.0  # tile weight = error^gamma + floor; higher = greedier
    tile_floor: float = 0.1  # uniform floor per tile, as a fraction of the view's mean error^gamma
    view_floor: float = 0.1  # floor per view, as a fraction of the mean view error
    ema_decay: float = 0.7  # memory <- decay * memory + (1 - decay) * new tile error
    fraction_start: float = 1.0  # share of a view's tiles rendered per step, early on ...
    fraction_end: float = 0.25  # ... and late in the run
    # Dense for the first fifth, sparse for the last two fifths: the early dense steps build the
    # geometry the error memory needs (going sparse sooner scored lower on the demo and a real capture).
    dense_until: float = 0.2  # progress until which fraction_start holds
    sparse_from: float = 0.6  # progress from which fraction_end holds (linear in between)

    def __post_init__(self):
        def check(ok: bool, what: str):
            if not ok:
                raise TurboGSError(f"sampler config: {what}")

        check(self.tile_size > 0, f"tile_size must be > 0, got {self.tile_size}")
        check(self.gamma >= 0, f"gamma must be >= 0, got {self.gamma}")
        check(self.tile_floor >= 0, f"tile_floor must be >= 0, got {self.tile_floor}")
        check(self.view_floor >= 0, f"view_floor must be >= 0, got {self.view_floor}")
        check(0 <= self.ema_decay < 1, f"ema_decay must be in [0, 1), got {self.ema_decay}")
        for name in ("fraction_start", "fraction_end"):
            value = getattr(self, name)
            check(0 < value <= 1, f"{name} must be in (0, 1], got {value}")
        check(
            0 <= self.dense_until <= self.sparse_from <= 1,
            f"need 0 <= dense_until ({self.dense_until}) <= sparse_from ({self.sparse_from}) <= 1",
        )

    def fraction_at(self, progress: float) -> float:
        """Share of a view's tiles to render at `progress` (0 = start, 1 = end of the run):
        fraction_start until dense_until, then linear to fraction_end at sparse_from."""
        progress = min(max(float(progress), 0.0), 1.0)
        if progress <= self.dense_until:
            return self.fraction_start
        if progress >= self.sparse_from:
            return self.fraction_end
        t = (progress - self.dense_until) / (self.sparse_from - self.dense_until)
        return self.fraction_start + t * (self.fraction_end - self.fraction_start)


class ErrorMemory:
    """Reconstruction error per (training view, tile).

    Storage: `errors` [V, T_max] float32 on `device`, T_max the largest tile count of any
    view. View v uses entries 0..T_v-1 (tile id ty * TW_v + tx); the rest is padding (0)
    and never read. A tile never rendered holds +inf, so the sampler takes it first. The
    first observation replaces +inf; later ones are blended in with an exponential moving
    average. The set of views is fixed at construction.
    """

    def __init__(self, image_sizes: Sequence[Tuple[int, int]], tile_size: int = TILE_SIZE, ema_decay: float = 0.7,
                 device="cpu"):
        """image_sizes: (height, width) of each training view, in view order."""
        if len(image_sizes) == 0:
            raise TurboGSError("error memory: the scene has no training views")
        if not 0 <= ema_decay < 1:
            raise TurboGSError(f"error memory: ema_decay must be in [0, 1), got {ema_decay}")
        self.image_sizes: List[Tuple[int, int]] = [(int(h), int(w)) for h, w in image_sizes]
        self.tile_size = int(tile_size)
        self.ema_decay = float(ema_decay)
        self.grids: List[Tuple[int, int]] = [tile_grid(h, w, self.tile_size) for h, w in self.image_sizes]
        counts = [rows * cols for rows, cols in self.grids]
        device = torch.device(device)
        self.tile_counts = torch.tensor(counts, dtype=torch.int64, device=device)
        self.errors = torch.zeros(len(counts), max(counts), dtype=torch.float32, device=device)
        for view, count in enumerate(counts):
            self.errors[view, :count] = float("inf")

    @classmethod
    def from_cameras(cls, cameras, config: Optional[SamplerConfig] = None, device="cpu") -> "ErrorMemory":
        """A memory for these cameras (anything with .height and .width), in their order."""
        config = config if config is not None else SamplerConfig()
        return cls([(c.height, c.width) for c in cameras], config.tile_size, config.ema_decay, device)

    def resized(self, image_sizes: Sequence[Tuple[int, int]]) -> "ErrorMemory":
        """A memory for the same views at other (height, width) sizes (coarse to fine's next
        training size): each new tile starts from the error of the old tile under its centre,
        so that the sampler goes on where the image was wrong instead of starting over."""
        resized = ErrorMemory(image_sizes, self.tile_size, self.ema_decay, self.device)
        for view, ((rows, cols), (new_rows, new_cols)) in enumerate(zip(self.grids, resized.grids)):
            ys = ((torch.arange(new_rows, device=self.device) + 0.5) * rows / new_rows).long().clamp_max(rows - 1)
            xs = ((torch.arange(new_cols, device=self.device) + 0.5) * cols / new_cols).long().clamp_max(cols - 1)
            old = self.errors[view, : rows * cols].reshape(rows, cols)
            resized.errors[view, : new_rows * new_cols] = old.index_select(0, ys).index_select(1, xs).reshape(-1)
        return resized

    @property
    def device(self) -> torch.device:
        return self.errors.device

    @property
    def num_views(self) -> int:
        return len(self.grids)

    def grid(self, view: int) -> Tuple[int, int]:
        """(TH, TW) of a view's tile grid."""
        return self.grids[view]

    def num_tiles(self, view: int) -> int:
        rows, cols = self.grids[view]
        return rows * cols

    def update(self, view: int, tile_ids: Tensor, tile_errors: Tensor) -> None:
        """Blend newly measured errors of a view's tiles into the memory.

        tile_ids: [K] unique int64 ids; tile_errors: [K] (e.g. TileLoss's tile_errors).
        Ids outside the view's grid and non-finite errors are ignored. `view` may be a 0-d
        index tensor on the device (all views of one grid, see TileSampler.sample)."""
        if torch.is_tensor(view):
            num_tiles = self.num_tiles(0)
        else:
            self._check_view(view)
            num_tiles = self.num_tiles(view)
        tile_ids = tile_ids.to(device=self.device, dtype=torch.int64).reshape(-1)
        tile_errors = tile_errors.detach().to(device=self.device, dtype=torch.float32).reshape(-1)
        if tile_ids.numel() != tile_errors.numel():
            raise ValueError(f"{tile_ids.numel()} tile ids but {tile_errors.numel()} tile errors")
        if tile_ids.numel() == 0:
            return
        kernels.error_memory_update(self.errors, view, num_tiles, tile_ids, tile_errors, self.ema_decay)

    def view_error(self, view: int) -> Tensor:
        """[TH, TW] copy of a view's tile errors (+inf = never rendered), e.g. for a heatmap."""
        self._check_view(view)
        rows, cols = self.grids[view]
        return self.errors[view, : rows * cols].reshape(rows, cols).clone()

    def seen_fraction(self) -> float:
        """Share of all tiles rendered at least once."""
        in_view = torch.arange(self.errors.shape[1], device=self.device)[None, :] < self.tile_counts[:, None]
        unseen = int((in_view & torch.isinf(self.errors)).sum())
        return 1.0 - unseen / int(self.tile_counts.sum())

    def state_dict(self) -> Dict:
        return {
            "errors": self.errors.detach().cpu().clone(),
            "image_sizes": [list(size) for size in self.image_sizes],
            "tile_size": self.tile_size,
            "ema_decay": self.ema_decay,
        }

    def load_state_dict(self, state: Dict) -> None:
        """Restore errors saved by state_dict(); the views and tile size must match."""
        sizes = [tuple(int(v) for v in size) for size in state.get("image_sizes", [])]
        if sizes != self.image_sizes or int(state.get("tile_size", -1)) != self.tile_size:
            raise TurboGSError(
                f"checkpoint error memory covers {len(sizes)} views with tile size {state.get('tile_size')}, "
                f"but this scene has {self.num_views} views with tile size {self.tile_size} "
                "(or different image sizes): resume with the same scene and settings"
            )
        errors = state["errors"]
        if tuple(errors.shape) != tuple(self.errors.shape):
            raise TurboGSError(
                f"checkpoint error memory has shape {tuple(errors.shape)}, expected {tuple(self.errors.shape)}"
            )
        self.errors.copy_(errors.to(self.errors.dtype))

    def _check_view(self, view: int) -> None:
        if not 0 <= view < self.num_views:
            raise IndexError(f"view {view} outside 0..{self.num_views - 1}")


@dataclass
class TileSample:
    """What to render this step: a view and, when sampling tiles, which of its tiles."""

    view: Union[int, Tensor]  # index into the training views (or a 0-d index tensor on the device)
    tile_ids: Optional[Tensor] = None  # [K] int64, ascending, unique: ids ty * TW + tx; None = every tile
    tile_mask: Optional[Tensor] = None  # [TH, TW] bool, True at tile_ids (for render(..., tile_mask=))


class TileSampler:
    """Chooses a view and its tiles from an ErrorMemory (Gumbel-top-k, see kernels/turbo_torch.py).

    View v is drawn with probability proportional to m_v + view_floor * mean(m), m_v being
    the mean error of its seen tiles; views that still have unseen tiles come first.
    Then K = ceil(fraction_at(progress) * T_v) distinct tiles are drawn without
    replacement (one after another) with probability proportional to
    e^gamma + tile_floor * mean(e^gamma); unseen tiles come first.

    The random draws come from this sampler's own torch.Generator (on the memory's device,
    so the same seed gives the same samples on the same kind of device).
    """

    def __init__(self, memory: ErrorMemory, config: Optional[SamplerConfig] = None, seed: int = 0):
        self.memory = memory
        self.config = config if config is not None else SamplerConfig()
        if self.config.tile_size != memory.tile_size:
            raise TurboGSError(
                f"sampler config: tile_size {self.config.tile_size} differs from the error memory's {memory.tile_size}"
            )
        self.generator = torch.Generator(device=memory.device)
        self.generator.manual_seed(int(seed))

    def tiles_per_step(self, view: int, progress: float) -> int:
        """K = ceil(fraction_at(progress) * T_v), at least 1."""
        total = self.memory.num_tiles(view)
        # The small slack keeps float noise (0.3 * 10 = 3.0000000000000004) from adding a tile.
        k = math.ceil(self.config.fraction_at(progress) * total - 1e-9)
        return min(max(k, 1), total)

    def sample(self, progress: float, view_on_device: bool = False) -> TileSample:
        """A view and K of its tiles. With `view_on_device`, when every view has the same tile
        grid, the view stays a 0-d tensor on the memory's device: no host read (the same draws)."""
        return self.sample_views(progress, 1, view_on_device)[0]

    def sample_views(self, progress: float, count: int, view_on_device: bool = False) -> List[TileSample]:
        """`count` distinct views (Gumbel top-k: without replacement, in the order drawn) and
        K tiles of each, drawn one view after another. A step of several views (--batch-views,
        or one per rank) draws them together, so that every rank computes the same draw and
        trains its own slice of it; count 1 is `sample`."""
        memory, config = self.memory, self.config
        if not 1 <= count <= memory.num_views:
            raise TurboGSError(f"tile sampler: {count} views per step, but there are {memory.num_views} training views")
        device = memory.device
        view_uniforms = torch.rand(memory.num_views, generator=self.generator, device=device)
        view_keys = kernels.view_sample_keys(memory.errors, memory.tile_counts, config.view_floor, view_uniforms)
        best = torch.argmax(view_keys).reshape(1) if count == 1 else torch.topk(view_keys, count).indices
        on_device = view_on_device and len(set(memory.grids)) == 1
        views = list(best.unbind(0)) if on_device else host_read.values(best)  # one read, counted by the audit
        return [self._sample_tiles(view, progress, on_device) for view in views]

    def _sample_tiles(self, view: Union[int, Tensor], progress: float, on_device: bool) -> TileSample:
        memory, config = self.memory, self.config
        device = memory.device
        grid_of = 0 if on_device else view  # on the device: every view has view 0's grid
        total = memory.num_tiles(grid_of)
        k = self.tiles_per_step(grid_of, progress)
        tile_uniforms = torch.rand(total, generator=self.generator, device=device)
        errors_row = memory.errors.index_select(0, view.reshape(1))[0] if on_device else memory.errors[view]
        tile_keys = kernels.tile_sample_keys(errors_row[:total], config.gamma, config.tile_floor, tile_uniforms)
        tile_ids = torch.topk(tile_keys, k, sorted=False).indices.sort().values

        rows, cols = memory.grid(grid_of)
        tile_mask = torch.zeros(rows * cols, dtype=torch.bool, device=device)
        tile_mask[tile_ids] = True
        return TileSample(view, tile_ids, tile_mask.reshape(rows, cols))

    def state_dict(self) -> Dict:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: Dict) -> None:
        try:
            self.generator.set_state(state["generator"])
        except (KeyError, RuntimeError, TypeError) as exc:
            raise TurboGSError(
                f"checkpoint sampler state does not fit a {self.generator.device.type} random generator ({exc}): "
                "resume on the same kind of device"
            ) from exc
