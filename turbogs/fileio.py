"""Write files atomically: a reader sees the old file or the new one, never half of one.

A run killed mid-save (Ctrl-C, out of time, out of disk) must not leave a truncated
checkpoint or .ply behind. Every writer therefore writes a temporary file in the same
folder (so the final rename stays on one filesystem), flushes it to disk, and only then
renames it onto the target with `os.replace`, which is atomic on POSIX and Windows.
"""

from __future__ import annotations

import json
import os
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Union

from turbogs.errors import InputError, TurboGSError

PathLike = Union[str, "os.PathLike[str]"]


def _temp_path_next_to(path: Path) -> Path:
    """A fresh hidden name in the target's folder that keeps the target's extension,
    because some writers (cv2.imwrite) choose the format from it."""
    return path.with_name(f".{path.stem}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp{path.suffix}")


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(folder: Path) -> None:
    """Make the rename itself durable. Not every platform can open a folder; that is fine."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextmanager
def atomic_path(path: PathLike) -> Iterator[Path]:
    """Yield a temporary path to write to; it becomes `path` only if the block succeeds.

    On any exception the temporary file is removed and `path` is left untouched.
    Writers that report failure by a return value (cv2.imwrite returns False) must raise
    inside the block, or an empty file would replace the old one.
    OSErrors (missing folder, full disk, no permission) become a one-line TurboGSError.
    """
    path = Path(path)
    tmp = _temp_path_next_to(path)
    try:
        # Created with O_EXCL and mode 0o666 so the umask applies as for a plain open().
        os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
    except OSError as e:
        raise TurboGSError(f"cannot write {path}: {e.strerror or e}") from e
    try:
        yield tmp
        _fsync_file(tmp)
        os.replace(tmp, path)
    except OSError as e:
        _remove_quietly(tmp)
        raise TurboGSError(f"cannot write {path}: {e.strerror or e}") from e
    except BaseException:
        _remove_quietly(tmp)
        raise
    _fsync_dir(path.parent)


def _remove_quietly(path: Path) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def atomic_write_bytes(path: PathLike, data: bytes) -> None:
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)


def atomic_write_text(path: PathLike, text: str, encoding: str = "utf-8") -> None:
    atomic_write_bytes(path, text.encode(encoding))


def atomic_write_json(path: PathLike, obj: Any, indent: int = 2) -> None:
    """Serialize first, so an unserializable object never touches the disk."""
    atomic_write_text(path, json.dumps(obj, indent=indent) + "\n")


def read_json(path: PathLike, expected: type = dict) -> Any:
    """The reading side: a JSON file whose top level must be an `expected` (dict or list).
    A missing, unreadable or malformed file is one InputError line, never a traceback."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: invalid JSON ({exc})") from None
    if not isinstance(data, expected):
        raise InputError(f"{path}: expected a JSON {'object' if expected is dict else 'list'} at the top level")
    return data
