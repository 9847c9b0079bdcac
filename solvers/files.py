"""Writing a file so a reader sees the old or the new one, never a torn one.

Every file atoll keeps (template libraries, sampled demand, a calibration, the controller's
state, plans and manifests, training checkpoints) is written through :func:`atomic_write_bytes`:
a temporary file in the same directory (same filesystem, so the rename is atomic), fsync,
``os.replace``, then fsync the directory so the rename itself survives a power cut. A process
killed at any instant leaves the old file and, at worst, a ``.<name>.<random>.tmp`` beside it
that no reader looks at.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path


def atomic_write_bytes(path: Path | str, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (see the module). The file it replaces keeps its
    mode; a new file gets 0644."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp makes the file 0600; plans and manifests are read by other users (a GitOps
        # agent, kubectl, a dashboard), so a new file gets the usual 0644
        try:
            mode = stat.S_IMODE(os.stat(path).st_mode)
        except OSError:
            mode = 0o644
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), mode)
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # some filesystems cannot fsync a directory
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def atomic_write_text(path: Path | str, text: str) -> None:
    """:func:`atomic_write_bytes` of ``text`` in UTF-8."""
    atomic_write_bytes(path, text.encode("utf-8"))
