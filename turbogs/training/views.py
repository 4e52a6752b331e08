"""The training views as the step reads them: cameras, images and masks, moved to the device once.

Why: a step that copies its camera's matrices to the GPU, or that has to know its view's
number on the host, waits for the host. Here every view's viewmat and K live on the device
from the start, and when all views share one size (the usual capture) they are also
stacked, so that a view chosen on the device (a 0-d index tensor, as `TileSampler` draws
it) picks its camera, image and mask by an index op, with no read.

Views whose sizes differ a little (a capture downscaled by 8 gives 125x82 and 125x83 px)
are stacked too, padded at the bottom and right to the largest size: see `can_pad`. A view
picked on the device then renders at the padded size with its own K (the extra rows and
columns lie off its image's edge) and its mask is 0 there, so that the padding counts in
no loss, tile error, PSNR or error memory. A view picked by a Python int (3dgs, the
warm-up, evaluation) gets its true size. Views that cannot be padded, or images
kept in CPU memory (--data-device cpu), take a Python int view only.
"""

from __future__ import annotations

import dataclasses
from typing import List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from turbogs.data.scene import Camera
from turbogs.tiles import TILE_SIZE, tile_grid

View = Union[int, Tensor]  # a Python index, or a 0-d int64 tensor on the device

BACKGROUND_COLOURS = 4096  # random backgrounds: a table of colours, cycled through
MAX_PADDING = 0.02  # the most padded pixels, as a share of the stack's pixels, for `can_pad`


def can_pad(sizes: Sequence[Tuple[int, int]], tile_size: int = TILE_SIZE) -> bool:
    """Whether views of these (width, height) sizes may be stacked padded to the largest.

    Two conditions, and why:
    - Every view keeps its tile grid: the padded size has the same tile rows and columns as
      each true size. The error memory, the tile sampler and the tile masks then work on the
      views' own grids, no tile is padding only (the sampler could never prefer one), and a
      padded view's border tiles count the same real pixels as its unpadded ones.
    - The padding is at most MAX_PADDING (2%) of the stack's pixels: memory, and work in the
      render, spent on pixels that count for nothing. Sizes one or two pixels apart (rounding
      after downscaling) pass; a capture of mixed cameras keeps the per-int path.
    """
    width, height = max(w for w, _ in sizes), max(h for _, h in sizes)
    if any(tile_grid(h, w, tile_size) != tile_grid(height, width, tile_size) for w, h in sizes):
        return False
    return sum(width * height - w * h for w, h in sizes) <= MAX_PADDING * width * height * len(sizes)


def _padded(tensors: List[Tensor], height: int, width: int, value: float = 0.0) -> Tensor:
    """[V, height, width, ...]: each tensor at the top left, `value` elsewhere."""
    out = tensors[0].new_full((len(tensors), height, width, *tensors[0].shape[2:]), value)
    for i, tensor in enumerate(tensors):
        out[i, : tensor.shape[0], : tensor.shape[1]] = tensor
    return out


def _row(stack: Tensor, view: Tensor) -> Tensor:
    """A stack's row for a view picked on the device (a 0-d index): index_select, not [view],
    because indexing by a 0-d tensor reads it back to the host."""
    return stack.index_select(0, view.reshape(1))[0]


def resize_area(image: Tensor, height: int, width: int) -> Tensor:
    """An [H, W] or [H, W, C] image at height x width, each pixel the mean over its footprint (the
    loader's downscaling, OpenCV's INTER_AREA): torch's "area" mode, on any device."""
    planes = image if image.dim() == 3 else image[..., None]
    out = F.interpolate(planes.permute(2, 0, 1)[None], size=(height, width), mode="area")[0].permute(1, 2, 0)
    return (out if image.dim() == 3 else out[..., 0]).contiguous()


def photo_alphas(cameras: Sequence[Camera], device) -> Optional[List[Optional[Tensor]]]:
    """The views' photo alphas on `device` (None for an opaque view), or None when no view has one."""
    if all(c.alpha is None for c in cameras):
        return None
    return [None if c.alpha is None else c.alpha.to(device) for c in cameras]


class TrainingViews:
    """alphas: each view's photo alpha [H, W] (None: opaque), where training composites the photos
    onto random colours (`backgrounds`) instead of `background`, the one their images were
    composited onto at load; None: the images as they are, over `background` (see `get`)."""

    def __init__(self, cameras: Sequence[Camera], images: List[Tensor], masks: List[Optional[Tensor]],
                 device: torch.device, alphas: Optional[List[Optional[Tensor]]] = None,
                 background: Optional[Tensor] = None, seed: int = 0):
        self.device, self.seed = device, seed
        self.background = background
        # Drawn once from the seed by a generator of their own (the run's other draws do not change).
        self.background_table = None if alphas is None else torch.rand(
            BACKGROUND_COLOURS, 3, generator=torch.Generator().manual_seed(seed)).to(device)
        # Cameras without their images, their matrices on the device (render() then copies nothing).
        self.cameras = [dataclasses.replace(c, K=c.K.to(device), world_to_cam=c.world_to_cam.to(device),
                                            image=None, mask=None, alpha=None) for c in cameras]
        self.images, self.masks, self.alphas = images, masks, alphas
        sizes = [(c.width, c.height) for c in cameras]
        on_device = all(image.device == device for image in images)
        masks_alike = all(m is None for m in masks) or all(m is not None and m.device == device for m in masks)
        sizes_differ = len(set(sizes)) > 1
        self.stacked = (not sizes_differ or can_pad(sizes)) and on_device and masks_alike
        self.padded = self.stacked and sizes_differ  # stacked at a size larger than some views'
        if self.stacked:
            self.width, self.height = max(w for w, _ in sizes), max(h for _, h in sizes)
            self.Ks = torch.stack([c.K for c in self.cameras])
            self.viewmats = torch.stack([c.world_to_cam for c in self.cameras])
            # The stacks hold the images; the per-view list becomes views into them (no second copy).
            self.image_stack = _padded(images, self.height, self.width)
            if self.padded:  # 1 on each view's real pixels (times its mask), 0 on the padding
                ones = [torch.ones(c.height, c.width, device=device) for c in cameras]
                self.real_stack = _padded(ones, self.height, self.width)
                if all(m is None for m in masks):
                    self.mask_stack = self.real_stack
                else:
                    self.mask_stack = _padded([o if m is None else m for o, m in zip(ones, masks)], self.height, self.width)
            else:
                self.mask_stack = None if masks[0] is None else torch.stack(masks)
            self.images = [stack[: c.height, : c.width] for c, stack in zip(cameras, self.image_stack.unbind(0))]
            if alphas is not None:  # opaque where a view has no alpha, and on the padding
                self.alpha_stack = _padded([torch.ones(c.height, c.width, device=device) if a is None else a.to(device)
                                            for c, a in zip(cameras, alphas)], self.height, self.width, value=1.0)
                self.alphas = [stack[: c.height, : c.width] for c, stack in zip(cameras, self.alpha_stack.unbind(0))]
            self.masks = [None if m is None else self.mask_stack[i, : c.height, : c.width]
                          for i, (c, m) in enumerate(zip(cameras, masks))]
            # Where a camera's own image (mask, alpha) was used as it is (no copy: the CPU), it now
            # points into the stack too, so that it is not held twice.
            for i, camera in enumerate(cameras):
                if camera.image is images[i]:
                    camera.image = self.images[i]
                if masks[i] is not None and camera.mask is masks[i]:
                    camera.mask = self.masks[i]
                if alphas is not None and alphas[i] is not None and camera.alpha is alphas[i]:
                    camera.alpha = self.alphas[i]

    def resized(self, sizes: Sequence[Tuple[int, int]]) -> "TrainingViews":
        """These views with their images (masks, alphas) resampled to `sizes`, one (width, height) a
        view, and their cameras to match: a training size of coarse to fine. The photos' alphas
        and their composite onto the background resample alike (both are linear in the pixels),
        so that a random background still composites as at full size."""
        cameras = [camera.resized(w, h) for camera, (w, h) in zip(self.cameras, sizes)]
        images = [resize_area(image, h, w) for image, (w, h) in zip(self.images, sizes)]
        masks = [None if m is None else resize_area(m, h, w) for m, (w, h) in zip(self.masks, sizes)]
        alphas = None if self.alphas is None else [None if a is None else resize_area(a, h, w)
                                                   for a, (w, h) in zip(self.alphas, sizes)]
        return TrainingViews(cameras, images, masks, self.device, alphas=alphas, background=self.background,
                             seed=self.seed)

    def real_pixels_only(self, image: Tensor, view: View) -> Tensor:
        """A rendered image with its padding (if any) zeroed, no gradient passing there: for
        what reads pixels without a mask (the curvature estimate's sampled pixels, which then
        match the unpadded view's, whose border tiles are padded with zeros too)."""
        if not (self.padded and torch.is_tensor(view)):
            return image
        return image * _row(self.real_stack, view)[..., None]

    def backgrounds(self, step: int, count: int) -> List[Tensor]:
        """The backgrounds of a step's `count` views: with alphas, the table's next colours, else
        the scene's. Indexing the table by the step is a view on the device: no copy or wait in
        the step, and a resumed run draws what the uninterrupted one would have."""
        if self.background_table is None:
            return [self.background] * count
        return [self.background_table[(step * count + i) % BACKGROUND_COLOURS] for i in range(count)]

    def get(self, view: View, background: Optional[Tensor] = None) -> Tuple[Camera, Tensor, Optional[Tensor]]:
        """(camera, ground truth [H, W, 3], mask [H, W] or None) of a view, on the device. A
        view picked on the device of padded views comes at the padded size, its mask 0 on the
        padding; a Python int view at its true size. With `background` (and the views' alphas),
        the ground truth is the photo composited onto that background instead."""
        camera, gt, mask = self._get(view)
        if background is not None and self.alphas is not None:
            alpha = _row(self.alpha_stack, view) if torch.is_tensor(view) else self.alphas[view]
            if alpha is not None:  # photo x a + old x (1 - a)  ->  photo x a + new x (1 - a)
                gt = gt + (1.0 - alpha.to(gt))[..., None] * (background - self.background).to(gt)
        return camera, gt, mask

    def _get(self, view: View) -> Tuple[Camera, Tensor, Optional[Tensor]]:
        if torch.is_tensor(view):
            if not self.stacked:
                raise ValueError("a device view index needs views of one size (or within can_pad) with their images "
                                 "on the device")
            camera = Camera(name="", width=self.width, height=self.height, K=_row(self.Ks, view),
                            world_to_cam=_row(self.viewmats, view))
            mask = None if self.mask_stack is None else _row(self.mask_stack, view)
            return camera, _row(self.image_stack, view), mask
        mask = self.masks[view]
        return self.cameras[view], self.images[view].to(self.device), None if mask is None else mask.to(self.device)


class ViewOrder:
    """INRIA's camera order: a fresh random permutation of the training views each epoch."""

    def __init__(self, num_views: int, generator: torch.Generator):
        self.num_views, self.generator, self.queue = num_views, generator, []

    def next(self) -> int:
        if not self.queue:
            self.queue = torch.randperm(self.num_views, generator=self.generator).tolist()
        return self.queue.pop()

    def state_dict(self) -> dict:
        return {"queue": list(self.queue)}

    def load_state_dict(self, state: dict) -> None:
        self.queue = list(state["queue"])
