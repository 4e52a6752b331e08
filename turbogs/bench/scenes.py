"""The one way a benchmark names a scene: `[NAME=]PATH[:r=R][:w][:FIELD=VALUE ...]`.

    demo=scenes/demo                          the demo scene, at full size, named "demo"
    test_colmap=/data/test_colmap:r=8         downscaled 8x (as train -r 8)
    synthetic=/tmp/captures/synthetic:w       RGBA photos over white (as train -w)
    demo=scenes/demo:density.max_gaussians=6000   a setting for this scene's runs alone

A benchmark that runs several scenes takes one `--scene` each, and `turbogs bench` takes the
same form as its SCENE, so a scene written down for one tool works in the others. NAME is a
label for tables (a bare word; without it, the folder's name); `r` and `w` are how the scene is
loaded; any other KEY=VALUE is a setting for that scene's runs, in the grammar of
`turbogs bench --set` (bench/settings.py): a cap or a start that suits one capture and not
another. A path that contains ':' cannot be named here.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Tuple

from turbogs.bench.settings import split_setting
from turbogs.errors import InputError

SPEC_FORM = "[NAME=]PATH[:r=R][:w][:FIELD=VALUE ...]"
_NAME = re.compile(r"[A-Za-z0-9_.+-]+")


@dataclass(frozen=True)
class SceneSpec:
    path: Path
    name: str = ""  # the NAME as given; "" when there was none (see label)
    resolution: Optional[int] = None  # as train -r: a downscale factor or a width; None: full size
    white_background: bool = False
    settings: Tuple[str, ...] = ()  # FIELD=VALUE for this scene's runs (bench/settings.py)

    @property
    def label(self) -> str:
        """What tables call the scene: its NAME, else its folder's name."""
        return self.name or self.path.name

    def train_flags(self) -> List[str]:
        """The `turbogs train` flags that load the scene this way (its settings have none)."""
        return (["-r", str(self.resolution)] if self.resolution is not None else []) + (
            ["-w"] if self.white_background else [])

    def load(self, **options):
        """The scene, loaded as the spec says; `options` go to load_scene (e.g. eval_split, or
        another resolution)."""
        from turbogs.data.load import load_scene

        return load_scene(self.path, **{"resolution": self.resolution, "white_background": self.white_background,
                                        **options})

    def __str__(self) -> str:
        options = ([f"r={self.resolution}"] if self.resolution is not None else []) + (
            ["w"] if self.white_background else []) + list(self.settings)
        return ":".join([f"{self.name}={self.path}" if self.name else str(self.path), *options])


def parse_scene_spec(text: str) -> SceneSpec:
    """`[NAME=]PATH[:r=R][:w][:FIELD=VALUE ...]` -> SceneSpec; InputError names what is wrong."""
    name, equals, rest = text.partition("=")
    if not equals or not _NAME.fullmatch(name):  # no NAME: the '=' (if any) belongs to an option
        name, rest = "", text
    path, *options = rest.split(":")
    if not path:
        raise InputError(f"scene '{text}': no path (the form is {SPEC_FORM})")
    resolution, white, settings = None, False, []
    for option in options:
        if option == "w":
            white = True
        elif option.startswith("r="):
            value = option[2:]
            if not value.isdigit() or int(value) < 1:
                raise InputError(f"scene '{text}': r={value} is not a downscale factor or a width in px")
            resolution = int(value)
        elif "=" in option:
            split_setting(option)  # a well-formed FIELD=VALUE; the field is checked where it is applied
            settings.append(option)
        else:
            raise InputError(f"scene '{text}': unknown option ':{option}' (the form is {SPEC_FORM}; "
                             "a downscale is :r=R)")
    return SceneSpec(Path(path), name, resolution, white, tuple(settings))


def scene_arg(text: str) -> SceneSpec:
    """parse_scene_spec as an argparse type: a bad spec is argparse's one-line usage error."""
    try:
        return parse_scene_spec(text)
    except InputError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def without_settings(spec: SceneSpec, tool: str) -> SceneSpec:
    """`spec`, for a tool that cannot apply per-scene settings (e.g. one that runs `turbogs train`)."""
    if spec.settings:
        raise InputError(f"scene '{spec}': {tool} takes no settings in a scene ({', '.join(spec.settings)})")
    return spec
