"""Where atoll finds its shipped tables, the shared public data, and where it caches.

One function each: :func:`shared_data_dir` (the public data sets), :func:`cache_root`
(template libraries, sampled demand, forecasts, a user's calibration) and
:func:`perf_factors_path` (the efficiency factors the performance model reads). Nothing a command
writes goes inside the installed package: caches and a user's calibration live in
``$ATOLL_CACHE_DIR`` or the platform's user cache folder.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from atoll.solvers.errors import MissingDataError

PACKAGE_DATA = Path(__file__).resolve().parent / "data"
CATALOG_PATH = PACKAGE_DATA / "catalog.json"
PERF_FACTORS_PATH = PACKAGE_DATA / "perf_factors.json"
# The source checkout (editable install); ../shared/data beside it is the default data folder.
REPO_ROOT = Path(__file__).resolve().parents[1]
ENV_SHARED_DATA = "ATOLL_SHARED_DATA"
ENV_CACHE_DIR = "ATOLL_CACHE_DIR"


def shared_data_dir() -> Path:
    """``$ATOLL_SHARED_DATA``, else ``../shared/data`` beside the checkout, else ``./shared/data``."""
    env = os.environ.get(ENV_SHARED_DATA)
    if env:
        candidates = [Path(env)]
    else:
        candidates = [REPO_ROOT.parent / "shared" / "data", Path.cwd() / "shared" / "data"]
    for path in candidates:
        if path.is_dir():
            return path
    raise MissingDataError(
        f"shared data folder not found (looked in {', '.join(str(p) for p in candidates)}) — set "
        f"{ENV_SHARED_DATA} to the folder that holds the public data sets (e.g. .../shared/data)"
    )


def user_cache_dir() -> Path:
    """The platform's per-user cache folder for atoll (XDG on Linux, Library/Caches on macOS)."""
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "atoll"
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA") or str(Path.home() / "AppData" / "Local")
        return Path(base) / "atoll" / "Cache"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "atoll"


def cache_root() -> Path:
    """``$ATOLL_CACHE_DIR`` if set, else :func:`user_cache_dir` (templates, forecasts)."""
    root = os.environ.get(ENV_CACHE_DIR)
    return Path(root) if root else user_cache_dir()


PERF_FACTORS_NAME = "perf_factors.json"


def user_perf_factors_path() -> Path:
    """Where ``atoll perf calibrate`` writes the user's factors: ``perf_factors.json`` under
    :func:`cache_root`."""
    return cache_root() / PERF_FACTORS_NAME


def perf_factors_path() -> Path:
    """The factors the performance model reads: the user's calibration when one exists
    (:func:`user_perf_factors_path`), else the table shipped with the package."""
    user = user_perf_factors_path()
    return user if user.is_file() else PERF_FACTORS_PATH
