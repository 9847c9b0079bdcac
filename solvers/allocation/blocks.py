"""Decomposition of a cost-mode round into independent blocks of services.

The only rows that tie services together are the availability rows a round builds (rows
without room for a node only bound templates to zero and get no terms). Group the services into
connected components, two services joined when templates of both have terms in one built row;
with no row spanning two components the ILP is a sum of independent ILPs, one per component (its
templates, its a_t, its demand rows and the rows it alone touches), and each is solved on its
own. Each block stops at the same relative gap g: z_b - L_b <= g z_b for its objective z_b and
dual bound L_b, so summing (all z_b >= 0) gives sum z_b - sum L_b <= g sum z_b: the combined
plan is within g of sum L_b, a lower bound on the joint optimum (the sum of the block optima),
and sum L_b is the round's bound. Adding the fixed models' constant to both sides keeps this;
the solver's absolute gap (1e-6 in HiGHS) adds up over blocks. Separate solves spare the solver
a search over the product of the blocks' trees; a round whose built rows join every service
stays one ILP, as does goodput mode (its share floor ties the models) and the one-GPU-type rule.
"""

from __future__ import annotations

import copy
from collections import defaultdict

import numpy as np

from atoll.solvers.allocation.reduction import RoundInstance
from atoll.solvers.problem import model_of


def split_blocks(inst: RoundInstance) -> list[RoundInstance]:
    """``inst`` split into the connected components of its services (two services joined when
    templates of both have terms in one availability row the round builds), in the order of
    their first service. Each block is a shallow copy restricted to its services, models and
    templates, without the fixed models and floors (the caller adds them back). A single component comes
    back as ``[inst]``, and so does an instance with a service left without templates (its
    demand row alone is infeasible; the joint ILP reports it)."""
    p = inst.problem
    parent = {s: s for s in inst.services}

    def find(s: str) -> str:
        while parent[s] != s:
            parent[s] = parent[parent[s]]
            s = parent[s]
        return s

    # per free template, from the library's index arrays (not a template object each: ~30 a
    # block, 7,500 blocks a fleet20 day): the demand rows it serves within the round (its own
    # service's when none is), the first of them its service here, and its built-row entries
    ix = p.index
    names = ix.services
    pos = inst.free_pos
    in_round = np.asarray([name in parent for name in names], dtype=bool)
    c1, c2 = ix.cover1[pos], ix.cover2[pos]
    has1 = in_round[c1]
    has2 = (c2 >= 0) & in_round[np.maximum(c2, 0)]
    first = np.where(has1, c1, np.where(has2, c2, ix.service[pos]))
    both = has1 & has2
    served = {names[i] for i in np.unique(np.concatenate([first, c2[both]])).tolist()}
    for a, b in sorted(set(zip(c1[both].tolist(), c2[both].tolist(), strict=True))):
        ra, rb = find(names[a]), find(names[b])  # a co-located template ties its model's two rows
        if ra != rb:
            parent[rb] = ra
    if inst.rows and len(pos):
        owner: dict[int, str] = {}  # built row -> a service with a term in it
        rc_ids, cols, _ = inst.built_entries(pos)
        for rc, sid in zip(rc_ids.tolist(), first[cols].tolist(), strict=True):
            svc = names[sid]
            ra, rb = find(owner.setdefault(rc, svc)), find(svc)
            if ra != rb:
                parent[rb] = ra
    if len(served & set(inst.services)) < len(inst.services):
        return [inst]
    groups: dict[str, list[str]] = defaultdict(list)
    for s in inst.services:
        groups[find(s)].append(s)
    if len(groups) < 2:
        return [inst]
    # one pass over the templates, not one per block: a 1,000-model round has ~2,000 blocks
    free_of: dict[str, list[int]] = defaultdict(list)  # root -> columns of inst.free
    for col, sid in enumerate(first.tolist()):  # its service in the round, as above
        free_of[find(names[sid])].append(col)
    blocks = []
    for root, services in groups.items():
        block = copy.copy(inst)
        block.services = services
        block.models = sorted({model_of(s) for s in services})
        block.free = [inst.free[c] for c in free_of[root]]
        block.free_pos = pos[free_of[root]]
        block.fixed = {}
        block.floor = {}
        blocks.append(block)
    return blocks


def combined_start_status(statuses: list[object]) -> object:
    """One start status for blocks solved apart: the first block's, unless a later block's start
    was not accepted (``warm_start_accepted`` then says no)."""
    if not statuses:
        return None
    return next((s for s in statuses if not str(s).endswith("kOk")), statuses[0])
