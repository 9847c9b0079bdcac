"""Stable-Baselines3 logger output that sends scalar metrics to an MLflow run.

The training loop only ever sees an SB3 :class:`~stable_baselines3.common.logger.Logger`
(``model.set_logger(make_logger(run_id))``); MLflow is imported here and nowhere in the loop.

SB3 calls :meth:`MLflowOutputFormat.write` on every ``logger.dump(step)`` with all recorded
key/values (``rollout/ep_rew_mean``, ``train/loss``, ...). Scalars become MLflow metrics at that step
in one ``log_batch`` call; images, figures, videos, hyperparameter blocks, strings and arrays are
skipped (MLflow metrics are numbers). A key recorded with ``exclude="mlflow"`` (or a tuple naming
``"mlflow"``) is left out, following SB3's per-format exclusion convention.
"""

from __future__ import annotations

import numbers
import posixpath
import re
import sys
import time
from collections.abc import Sequence
from typing import Any

from mlflow.entities import Metric
from mlflow.tracking import MlflowClient
from stable_baselines3.common.logger import (
    HumanOutputFormat,
    KVWriter,
    Logger,
    filter_excluded_keys,
    make_output_format,
)

__all__ = ["FORMAT_NAME", "MLflowOutputFormat", "make_logger", "sanitize_metric_key"]

FORMAT_NAME = "mlflow"
"""Name of this output in SB3's ``exclude=`` convention: ``logger.record(k, v, exclude="mlflow")``."""

# Limits from mlflow.utils.validation (MAX_ENTITY_KEY_LENGTH, MAX_METRICS_PER_BATCH); copied rather
# than imported because that module is internal.
_MAX_KEY_LENGTH = 250
_MAX_METRICS_PER_BATCH = 1000

# MLflow accepts alphanumerics, "_", "-", ".", " ", "/" everywhere and ":" on POSIX only; dropping ":"
# too keeps a store readable from any OS.
_REJECTED_CHARS = re.compile(r"[^/\w.\- ]")

# SB3 formats that write into the logger folder (stable_baselines3.common.logger.make_output_format).
_SB3_FILE_FORMATS = ("log", "csv", "json", "tensorboard")


def sanitize_metric_key(key: str) -> str:
    """Turn an SB3 logger key into a name MLflow accepts as a metric key.

    Characters MLflow rejects become ``_``. Because MLflow treats names as paths, empty and ``.``
    segments are dropped and ``..`` segments become ``__`` (so ``a//b`` -> ``a/b``, ``/a/`` -> ``a``).
    The result is at most 250 characters. Ordinary SB3 keys (``rollout/ep_rew_mean``) are unchanged.
    """
    cleaned = _REJECTED_CHARS.sub("_", str(key))
    segments = ["__" if s == ".." else s for s in cleaned.split("/") if s not in ("", ".")]
    name = "/".join(segments)[:_MAX_KEY_LENGTH].rstrip("/")
    # MLflow's own path test (mlflow.utils.validation.path_not_unique): also catches a leading ".."
    # inside a segment ("..a") and a "." segment left by truncation. Rare; flatten such names.
    if not name or posixpath.normpath(name) != name or name.startswith(".."):
        name = name.replace("/", "_").replace(".", "_") or "_"
    return name


def _as_float(value: Any) -> float | None:
    """The value as a float if it is a real scalar, else ``None`` (the key is then skipped)."""
    if isinstance(value, str | bytes):
        return None
    # MLflow rejects bools as metric values; 0/1 is what a curve of a flag means.
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, numbers.Real):  # int, float and numpy integer/floating/bool_ scalars
        return float(value)
    # 0-d numpy arrays and torch tensors: scalars in all but type. Larger arrays (histograms) are skipped.
    if getattr(value, "ndim", None) == 0 and callable(getattr(value, "item", None)):
        item = value.item()
        if isinstance(item, numbers.Real):
            return float(item)
    return None


class MLflowOutputFormat(KVWriter):
    """SB3 ``KVWriter`` that logs scalar key/values as metrics of one MLflow run.

    Args:
        run_id: the MLflow run to log into. It is addressed explicitly through an ``MlflowClient``, so
            no active (fluent) run is needed and none is started, resumed or ended.
        client: the client to use; by default one for the current tracking URI (``MLFLOW_TRACKING_URI``
            or ``mlflow.set_tracking_uri``).

    Raises:
        mlflow.exceptions.MlflowException: if the run does not exist (checked once here so a typo fails
            before training starts rather than at the first dump).
    """

    def __init__(self, run_id: str, client: MlflowClient | None = None) -> None:
        self.run_id = run_id
        self._client = client if client is not None else MlflowClient()
        self._client.get_run(run_id)
        self._closed = False

    def write(
        self, key_values: dict[str, Any], key_excluded: dict[str, tuple[str, ...]], step: int = 0
    ) -> None:
        """Log every non-excluded scalar in ``key_values`` as a metric at ``step``.

        Keys are sanitized with :func:`sanitize_metric_key`; if two keys sanitize to the same name the
        later one (in ``key_values`` order) wins. NaN and infinite values are logged as they are: they
        are a real signal (a diverging loss), and MLflow stores them.
        """
        if self._closed:
            raise RuntimeError("MLflowOutputFormat.write called after close()")
        timestamp = int(time.time() * 1000)
        values: dict[str, float] = {}
        for key, value in filter_excluded_keys(key_values, key_excluded, FORMAT_NAME).items():
            number = _as_float(value)
            if number is not None:
                values[sanitize_metric_key(key)] = number
        metrics = [Metric(key, value, timestamp, int(step)) for key, value in values.items()]
        for start in range(0, len(metrics), _MAX_METRICS_PER_BATCH):
            self._client.log_batch(self.run_id, metrics=metrics[start : start + _MAX_METRICS_PER_BATCH])

    def close(self) -> None:
        """Mark the writer closed. Nothing is held open: each write is a self-contained request."""
        self._closed = True


def make_logger(
    run_id: str,
    folder: str | None = None,
    extra_formats: Sequence[str] = ("stdout",),
) -> Logger:
    """An SB3 ``Logger`` writing to the MLflow run ``run_id`` and to SB3's own ``extra_formats``.

    Args:
        run_id: MLflow run that receives the metrics (see :class:`MLflowOutputFormat`).
        folder: directory for SB3's file formats (``"log"``, ``"csv"``, ``"json"``, ``"tensorboard"``);
            not needed for ``"stdout"`` or when ``extra_formats`` is empty.
        extra_formats: SB3 format names besides MLflow; ``()`` for MLflow only. A single string is read
            as one format name.

    Returns:
        The logger, for ``model.set_logger(...)``.

    Raises:
        ValueError: a file format without ``folder``, ``"mlflow"`` listed again, or an unknown format.
    """
    names = (extra_formats,) if isinstance(extra_formats, str) else tuple(extra_formats)
    if FORMAT_NAME in names:
        raise ValueError(f"{FORMAT_NAME!r} is always included; do not list it in extra_formats")
    outputs: list[KVWriter] = []
    for name in names:
        if name == "stdout":
            # make_output_format would create a log directory even for stdout; none is needed.
            outputs.append(HumanOutputFormat(sys.stdout))
        elif name not in _SB3_FILE_FORMATS:
            raise ValueError(
                f"unknown SB3 output format {name!r}; known: stdout, {', '.join(_SB3_FILE_FORMATS)}"
            )
        elif folder is None:
            raise ValueError(f"SB3 output format {name!r} writes files: pass folder=")
        else:
            outputs.append(make_output_format(name, folder))
    outputs.append(MLflowOutputFormat(run_id))
    return Logger(folder=folder, output_formats=outputs)
