"""The brute-force view of a template library the library tests share: the multisets a library
must keep (placed by the test's own brute force) and the multisets it kept, per template job."""

from __future__ import annotations

from collections.abc import Mapping

from atoll.solvers.templates import TemplateJob, TemplateLibrary

Multiset = tuple[str, ...]  # sorted node config names, one per node


def _within(a: Multiset, b: Multiset) -> bool:
    return all(a.count(c) <= b.count(c) for c in set(a))


def non_dominated(everything: Mapping[Multiset, float]) -> set[Multiset]:
    """The multisets of positive throughput that no other multiset within them matches
    (throughput can fall when a node is added, so every sub-multiset counts)."""
    return {ms for ms, thr in everything.items() if thr > 0 and not any(
        other != ms and _within(other, ms) and everything[other] >= thr for other in everything)}


def kept_multisets(library: TemplateLibrary, job: TemplateJob) -> dict[Multiset, float]:
    """Multiset -> throughput of the templates ``library`` holds for ``job``'s service and region."""
    return {tuple(sorted(c for c, k in t.nodes for _ in range(k))): t.throughput
            for t in library.for_service(job.service) if t.region == job.region}
