"""``json:DIR``: a plan per file, ``latest.json`` beside them, written atomically, the newest kept."""

from __future__ import annotations

import json
from pathlib import Path

from atoll.control.plans import PlanRecord, SinkError, SinkResult
from atoll.solvers.files import atomic_write_text


class JsonDirSink:
    """``json:DIR``: one JSON file per plan plus ``latest.json`` (the same document); the newest
    ``keep`` numbered files are kept (a month of 5 s ticks must not fill the disk)."""

    def __init__(self, directory: Path | str, keep: int = 200) -> None:
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise SinkError(f"JsonDirSink: field 'keep' must be an integer >= 1, got {keep!r}")
        self.directory = Path(directory)
        self.keep = keep
        self.name = f"json:{self.directory}"

    def _check_owner(self, latest: Path, owner: str) -> None:
        try:
            theirs = json.loads(latest.read_text(encoding="utf-8")).get("owner", "")
        except (OSError, ValueError, AttributeError):
            return  # no plan yet, or not one of ours to judge: it is replaced
        if theirs and owner and theirs != owner:
            raise SinkError(f"{self.name}: {latest} was written by controller {theirs!r}, this one is "
                            f"{owner!r}; give each controller its own json:DIR folder")

    def write(self, record: PlanRecord) -> SinkResult:
        text = json.dumps(record.as_dict(), indent=2) + "\n"
        path = self.directory / f"plan-{record.sequence:06d}.json"
        latest = self.directory / "latest.json"
        removed: list[str] = []
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._check_owner(latest, record.owner)
            # the numbered file first: latest.json never names a plan whose own file is missing
            atomic_write_text(path, text)
            atomic_write_text(latest, text)
            plans = sorted(self.directory.glob("plan-[0-9]*.json"))  # zero-padded: oldest first
            for old in plans[:-self.keep]:
                old.unlink(missing_ok=True)
                removed.append(str(old))
            for tmp in self.directory.glob(".*.json.*.tmp"):  # left by a write killed mid-way
                tmp.unlink(missing_ok=True)
        except OSError as exc:
            raise SinkError(f"{self.name}: cannot write {path.name} ({exc}); check that the directory is "
                            f"writable and the disk not full") from exc
        return SinkResult(self.name, True, (str(path), str(latest)), tuple(removed),
                          f"plan {record.sequence}: {len(record.plan)} template(s), "
                          f"{len(record.diff)} changed")
