"""Real disk faults for tests: a size-limited filesystem and a failing fsync.

- `size_limited_tmpfs`: mounts a `tmpfs` with `size=` (a real ENOSPC);
  unmounted when the block ends. Skips, saying why, when mounting is not
  possible (not root, no CAP_SYS_ADMIN).
- `fill`: takes every free byte of a filesystem with one file; removing it
  gives the space back.
- `fsync_fault_shim`: compiles tests/faults/fsync_eio.c with `cc`, an
  `LD_PRELOAD` shim that fails fsync/fdatasync of chosen files with EIO at
  the libc boundary. Skips, saying why, without a C compiler.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

SHIM_SOURCE = Path(__file__).parent / "faults" / "fsync_eio.c"
TRIGGER_ENV = "RAFTSCHED_FAULT_FSYNC_TRIGGER"
SUFFIX_ENV = "RAFTSCHED_FAULT_FSYNC_SUFFIX"


@contextlib.contextmanager
def size_limited_tmpfs(mount_point: Path, size: str) -> Iterator[Path]:
    mount_point.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"SKIPPED LOUDLY: cannot mount a tmpfs for ENOSPC: {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        # Lazy: a node process that outlived its test still holds files.
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def fill(directory: Path) -> Path:
    """Write one file until the filesystem is full; return it."""
    filler = directory / "filler"
    chunk = b"\xa5" * (256 * 1024)
    with open(filler, "wb", buffering=0) as handle:
        while True:
            try:
                handle.write(chunk)
            except OSError as error:
                if error.errno != errno.ENOSPC:
                    raise
                break
        # The last pages, smaller than a chunk.
        with contextlib.suppress(OSError):
            while handle.write(b"\xa5" * 4096):
                pass
    return filler


def fsync_fault_shim(build_dir: Path) -> Path:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("SKIPPED LOUDLY: no C compiler (cc/gcc) to build the fsync fault shim")
    library = build_dir / "fsync_eio.so"
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-O2", "-o", str(library), str(SHIM_SOURCE), "-ldl"],
        check=True,
    )
    return library


def fsync_fault_env(library: Path, trigger: Path, suffix: str) -> dict[str, str]:
    preload = os.environ.get("LD_PRELOAD", "")
    return {
        "LD_PRELOAD": f"{library} {preload}".strip(),
        TRIGGER_ENV: str(trigger),
        SUFFIX_ENV: suffix,
    }
