"""Normalisation families: layer_norm, rms_norm (incl. weight_offset / Gemma), group_norm.

All accumulate in f32 and fuse the affine. One kernel template `kf_norm` serves three designs:
a row handled by `ROWT` threads (a warp or part of one: shuffles only; or the whole block),
the row held in registers when it fits (x read once, exact two-pass statistics), else read
twice with shifted sums (shift = the row's first element, which keeps E[x^2]-E[x]^2 from
cancelling when |mean| >> std).

Few long rows (a group is a row for group_norm): `kf_norm_split` cuts each row over several
CTAs that keep their chunk in shared memory and combine shifted partial sums, either as one
thread-block cluster per row (`cluster_row`, DSMEM) or as a cooperative grid over the whole GPU
(`coop_row`, partials through scratch in y between two grid barriers); one launch either way.

group_norm adds `two_phase`: a group is one contiguous run of C/G*HxW elements, often far too
few groups (32) to fill 132 SMs with one block each, so phase 1 splits every group over many
blocks writing partial sums to stream-ordered scratch, and phase 2 (as many blocks) combines
them and applies; phase 2 can walk the data in reverse so its first reads hit what phase 1
left in L2. `cluster_group` does it in one launch with a cluster per group.

Every launcher checks sizes and alignment at run time and falls back to the generic `kf_norm`
(scalar loads, one block per row) for anything its fast path does not take.

One module a kind of design (registered in this order, the registry's): common.py (the template
and helpers), rows.py, split.py, group.py, cpu.py.
"""
from __future__ import annotations

from kforge_tui.search.families.norms import rows, split, group, cpu  # noqa: F401  (registry order)
