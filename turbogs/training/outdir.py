"""The output folder: checked before training starts, and owned by one run at a time.

Problems that would otherwise surface after an hour of training (an output path that is
a file, a read-only folder, a full disk, a second run writing into the same folder) are
found here, before any work is done.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from turbogs.errors import TurboGSError

MIN_FREE_BYTES = 200 * 1024 * 1024


def check_output_dir(out_dir: Path, min_free_bytes: int = MIN_FREE_BYTES) -> None:
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise TurboGSError(f"{out_dir}: the output path is a file, not a folder")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TurboGSError(f"{out_dir}: cannot create the output folder ({exc.strerror})") from None
    # os.access answers for the permission bits and read-only mounts without writing; the probe
    # catches what it cannot see (quotas, ACLs, network filesystems). Root passes both on a
    # chmod'ed folder: the kernel lets root write there, so training would indeed succeed.
    if not os.access(out_dir, os.W_OK | os.X_OK):
        raise TurboGSError(f"{out_dir}: the output folder is not writable (permission denied)")
    probe = out_dir / ".write_test"
    try:
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as exc:
        raise TurboGSError(f"{out_dir}: the output folder is not writable ({exc.strerror})") from None
    free = shutil.disk_usage(out_dir).free
    if free < min_free_bytes:
        raise TurboGSError(
            f"{out_dir}: only {free / 2**20:.0f} MiB free on this disk; at least {min_free_bytes / 2**20:.0f} MiB are needed"
        )


@contextmanager
def exclusive_output(out_dir: Path) -> Iterator[None]:
    """Hold an advisory lock on `out_dir/.lock` so that a second run into the same folder
    refuses instead of interleaving its files with ours. The OS drops the lock if we die."""
    lock_path = Path(out_dir) / ".lock"
    handle = open(lock_path, "a+")
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        handle.close()
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            raise TurboGSError(f"{out_dir}: another turbogs run is writing into this folder; use another --out") from None
        raise
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        yield
    finally:
        fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
        handle.close()
