"""Mean prompt and output lengths of the Azure LLM 2023 traces, for the solver scenarios.

The scenarios give model i the lengths of the ``code`` trace when i is even and of ``conv``
when i is odd (Coral's assignment), so prefill-heavy and decode-heavy models alternate.
Source: github.com/Azure/AzurePublicDataset (CC-BY 4.0), Patel et al., "Splitwise", ISCA 2024.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

from atoll.forecast.workloads import AZURE_TRACES, WorkloadError
from atoll.solvers.paths import shared_data_dir

# Order of alternation: model 0 gets the first trace, model 1 the second, and so on.
ASSIGNMENT_ORDER: tuple[str, ...] = ("code", "conv")


@dataclass(frozen=True)
class LengthStats:
    """Request count and mean input/output tokens of one trace."""

    trace: str
    requests: int
    mean_input_tokens: float
    mean_output_tokens: float

    def __post_init__(self) -> None:
        if self.requests <= 0:
            raise WorkloadError(f"LengthStats {self.trace!r}: field 'requests' must be > 0, "
                                f"got {self.requests}")
        for name in ("mean_input_tokens", "mean_output_tokens"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise WorkloadError(f"LengthStats {self.trace!r}: field '{name}' must be "
                                    f"finite and >= 0, got {value!r}")


def _trace_stats(trace: str, path: Path) -> LengthStats:
    n, sum_in, sum_out = 0, 0.0, 0.0
    with path.open(newline="") as fh:
        for line, row in enumerate(csv.DictReader(fh), start=2):
            try:
                sum_in += float(row["ContextTokens"])
                sum_out += float(row["GeneratedTokens"])
            except (KeyError, TypeError, ValueError) as exc:
                raise WorkloadError(f"{path}:{line}: expected numeric ContextTokens and "
                                    f"GeneratedTokens columns ({exc})") from exc
            n += 1
    if n == 0:
        raise WorkloadError(f"{path}: no requests")
    return LengthStats(trace=trace, requests=n, mean_input_tokens=sum_in / n,
                       mean_output_tokens=sum_out / n)


def azure_length_stats(data: Path | None = None) -> dict[str, LengthStats]:
    """``{"code": ..., "conv": ...}``: request count and mean input/output tokens per trace."""
    folder = (data or shared_data_dir()) / "azure-llm-inference-2023"
    out = {}
    for trace, file in AZURE_TRACES.items():
        path = folder / file
        if not path.exists():
            raise FileNotFoundError(f"Azure trace missing: {path} — check ATOLL_SHARED_DATA")
        out[trace] = _trace_stats(trace, path)
    return out


def assign_azure_lengths(n_models: int, data: Path | None = None) -> list[LengthStats]:
    """Lengths for models 0..n_models-1: code, conv, code, conv, ..."""
    if n_models < 1:
        raise WorkloadError(f"n_models must be >= 1, got {n_models}")
    stats = azure_length_stats(data)
    return [stats[ASSIGNMENT_ORDER[i % len(ASSIGNMENT_ORDER)]] for i in range(n_models)]
