"""The proposer contract: given a node of the search tree and what was measured, write a child.

Two implementations: `builtin.BuiltinProposer` (parameterised expert kernel families, no
network) and `llm.LLMProposer` (any litellm model). The MCTS never knows which one it has.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass
class NodeView:
    """What a proposer may know about one existing node (read from the tree/store)."""

    node_id: int
    parent_id: int | None
    action: str
    source: str | None  # None for the root (the PyTorch reference)
    params: dict = field(default_factory=dict)  # built-in family parameters, {} for LLM/hand nodes
    status: str = "pending"  # "ok", a failure status, or "pending" while in flight
    message: str = ""  # one-line outcome
    time_us: float | None = None
    speedup: float | None = None
    resources: dict = field(default_factory=dict)
    error_log: str = ""  # static/compile log, or the mismatch report, for repairs


@dataclass
class ProposalContext:
    task: dict  # Task.to_json()
    signature: str  # the generic entry point declaration (regions.abi)
    canonical: str  # the task's ABI header (regions.abi): every input/output as constants
    reference: str  # the region's PyTorch code (GraphModule.code): the reference
    device: dict  # DeviceInfo.to_json() plus "bandwidth_gbs" when measured
    eager_us: float | None
    compiled_us: float | None
    floor_us: float | None
    parent: NodeView  # the node being expanded (the root for a first proposal)
    ancestors: list[NodeView]  # root first, excluding parent
    siblings: list[NodeView]  # existing children of parent (to try something different)
    tried: list[dict]  # params of every built-in node of this task so far (to avoid repeats)
    mode: str = "improve"  # "improve" | "repair" (parent failed: fix it) | "root" (first kernel)
    best: NodeView | None = None  # best verified node of the task so far
    seed: int = 0
    # the kernel languages this search may propose in (search/languages.py); [] means the
    # task's own backend only. `auto` on a GPU: ["triton", "cuda"]
    languages: list = field(default_factory=list)
    # the source of every kernel of this task so far, in flight included: a proposer need not
    # send one again under another name (two points may render alike). The texts themselves:
    # a str caches its hash, so the set costs no hashing of sources per expansion
    sources: set = field(default_factory=set)


@dataclass
class Proposal:
    source: str | None  # None: the proposer had nothing usable (error says why)
    action: str  # short label shown in the tree, e.g. "family:warp_per_row", "set:vec=8", "llm:repair"
    proposer: str  # "builtin" | the LLM model string | "hand"
    params: dict = field(default_factory=dict)
    prompt: str | None = None
    response: str | None = None
    error: str | None = None  # why no source (prose answer, HTTP 429 after retries, ...)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    exhausted: bool = False  # the proposer has no further distinct idea from this parent


class Proposer(Protocol):
    name: str

    async def propose(self, ctx: ProposalContext) -> Proposal: ...

    def can_expand(self, ctx: ProposalContext) -> bool:
        """False when this proposer has nothing new to offer from ctx.parent (stops widening)."""
        ...
