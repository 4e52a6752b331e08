"""The training views as the step reads them: cameras, images and masks, moved to the device once.

Why: a step that copies its camera's matrices to the GPU, or that has to know its view's
number on the host, waits for the host. Here every view's viewmat and K live on the device
from the start, and when all views share one size (the usual capture) they are also
stacked, so that a view chosen on the device (a 0-d index tensor, as `TileSampler` draws
it) picks its camera, image and mask by an index op, with no read.

Views of different sizes, or images kept in CPU memory (--data-device cpu), take a
Python int view instead, as before.
"""

from __future__ import annotations

import dataclasses
from typing import List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from turbogs.data.scene import Camera

View = Union[int, Tensor]  # a Python index, or a 0-d int64 tensor on the device


class TrainingViews:
    def __init__(self, cameras: Sequence[Camera], images: List[Tensor], masks: List[Optional[Tensor]],
                 device: torch.device):
        self.device = device
        # Cameras without their images, their matrices on the device (render() then copies nothing).
        self.cameras = [dataclasses.replace(c, K=c.K.to(device), world_to_cam=c.world_to_cam.to(device),
                                            image=None, mask=None) for c in cameras]
        self.images, self.masks = images, masks
        sizes = {(c.width, c.height) for c in cameras}
        on_device = all(image.device == device for image in images)
        masks_alike = all(m is None for m in masks) or all(m is not None and m.device == device for m in masks)
        self.stacked = len(sizes) == 1 and on_device and masks_alike
        if self.stacked:
            self.width, self.height = next(iter(sizes))
            self.Ks = torch.stack([c.K for c in self.cameras])
            self.viewmats = torch.stack([c.world_to_cam for c in self.cameras])
            # The stacks hold the images; the per-view list becomes views into them (no second copy).
            self.image_stack = torch.stack(images)
            self.mask_stack = None if masks[0] is None else torch.stack(masks)
            self.images = list(self.image_stack.unbind(0))
            self.masks = [None] * len(masks) if self.mask_stack is None else list(self.mask_stack.unbind(0))
            # Where a camera's own image was used as it is (no copy: the CPU), it now points into
            # the stack too, so that the images are not held twice.
            for camera, image, mask, stacked_image, stacked_mask in zip(cameras, images, masks, self.images, self.masks):
                if camera.image is image:
                    camera.image = stacked_image
                if mask is not None and camera.mask is mask:
                    camera.mask = stacked_mask

    def get(self, view: View) -> Tuple[Camera, Tensor, Optional[Tensor]]:
        """(camera, ground truth [H, W, 3], mask [H, W] or None) of a view, on the device."""
        if torch.is_tensor(view):
            if not self.stacked:
                raise ValueError("a device view index needs views of one size with their images on the device")
            index = view.reshape(1)  # index_select, not [view]: indexing by a 0-d tensor reads it back

            def pick(stack: Tensor) -> Tensor:
                return stack.index_select(0, index)[0]

            camera = Camera(name="", width=self.width, height=self.height, K=pick(self.Ks),
                            world_to_cam=pick(self.viewmats))
            return camera, pick(self.image_stack), None if self.mask_stack is None else pick(self.mask_stack)
        mask = self.masks[view]
        return self.cameras[view], self.images[view].to(self.device), None if mask is None else mask.to(self.device)
