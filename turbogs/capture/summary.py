"""What SfM tells the user: images registered out of the total, points, mean reprojection error, the
time of each phase, and, when the mapping split or left images out, how many and what to try."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List

from turbogs.errors import InputError

THOROUGH = "turbogs sfm --force --thorough may register more of them (guided matching, more features; slower)"
TRY = ("try more photos with more overlap (each sharing most of the view with the next), "
       "sharper photos, or fewer moving objects")


class SfmTooFew(InputError):
    """Too few images registered; the summary rides along for scripts that tabulate it."""

    def __init__(self, summary: "SfmSummary", message: str):
        super().__init__(message)
        self.summary = summary


@dataclass
class SfmSummary:
    total_images: int
    matching: str = ""
    camera_mode: str = ""
    registered: int = 0
    points: int = 0
    reprojection_error: float = float("nan")
    models: List[int] = field(default_factory=list)  # images registered in each model, largest first
    seconds: Dict[str, float] = field(default_factory=dict)  # per phase
    retried: int = 0  # images the second mapping pass registered
    thorough: bool = False  # guided matching and more features (turbogs sfm --thorough) were on

    @property
    def left_out(self) -> int:
        return self.total_images - self.registered

    def check(self, where: Path, min_registered: int) -> None:
        """Fewer than `min_registered` images in the model, or under half of them: an InputError."""
        if self.registered < min_registered or 2 * self.registered < self.total_images:
            split = f" (the mapping split into {len(self.models)} models of {self.models} images)" \
                if len(self.models) > 1 else ""
            more = "" if self.thorough else "turbogs sfm --force --thorough, or "
            raise SfmTooFew(self, f"{where}: SfM registered only {self.registered} of {self.total_images} "
                                  f"photos{split}; " + more + TRY)

    def lines(self) -> List[str]:
        times = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in self.seconds.items())
        cameras = "one camera per folder" if self.camera_mode == "PER_FOLDER" else "one camera per photo"
        out = [f"SfM: {self.registered} of {self.total_images} images registered, {self.points} points, "
               f"mean reprojection error {self.reprojection_error:.2f} px ({self.matching} matching, {cameras}; "
               f"{times})"]
        if self.retried:
            out.append(f"the second mapping pass registered {self.retried} of the images the first left out")
        if len(self.models) > 1:
            out.append(f"the mapping split into {len(self.models)} models ({', '.join(map(str, self.models))} images); "
                       f"kept the largest: {self.left_out} images left out")
        elif self.left_out:
            out.append(f"{self.left_out} images could not be registered and are left out")
        if self.left_out and not self.thorough:
            out.append(THOROUGH)
        return out

    def to_dict(self) -> dict:
        return {"total_images": self.total_images, "registered": self.registered, "points": self.points,
                "mean_reprojection_error": self.reprojection_error, "models": self.models,
                "matching": self.matching, "camera_mode": self.camera_mode, "seconds": self.seconds,
                "retried": self.retried, "thorough": self.thorough}
