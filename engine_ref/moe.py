"""A Qwen2-MoE sparse block: a router, top-k routed SwiGLU experts, an optional shared expert.

The arithmetic is Hugging Face's (`Qwen2MoeSparseMoeBlock`), so logits match `transformers`:
router logits = x·Wᵣᵀ (plus a configured bias, the skew fault) → softmax in fp32 → top-k →
optionally renormalised to sum to 1 → cast back to x's dtype; each chosen expert adds
`weight · down(silu(gate(x)) · up(x))` to its tokens' output, experts in ascending order;
the shared expert's output is scaled by `sigmoid(shared_expert_gate(x))` and added.

Expert weights are fused 3-D tensors like transformers 5 holds them: `gate_up_proj`
[E, 2·I, h] (gate rows first) and `down_proj` [E, h, I].

Expert parallelism (parallel.py `shard_moe`): a rank keeps the experts the placement gives
it (`local_experts`: E/N contiguous ones by default, any E/N with
`EngineConfig.expert_placement`) and its column/row share of the shared expert. Every
rank routes every token (the hidden states are replicated after attention's all-reduce),
computes only its own experts and its shared-expert share, and one all_reduce sums the
partial outputs (gather/scatter placement: no all-to-all).

Tokens per expert: the router's top-k choices are counted with one `bincount` per layer
and kept on the device (`self.loads`, all E experts, this step); the engine reads every
layer's counts once per step when something records them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig


class SharedExpert(nn.Module):
    """A dense SwiGLU (fused gate/up, like model.MLP) without its own all-reduce: the MoE
    block sums its partial output with the experts' in one."""

    def __init__(self, hidden: int, inter: int) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden, 2 * inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj.forward(x).chunk(2, dim=-1)
        return self.down_proj.forward(F.silu(gate) * up)


class Experts(nn.Module):
    """The routed experts this rank holds, as two 3-D weights."""

    def __init__(self, num: int, hidden: int, inter: int) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(num, 2 * inter, hidden))
        self.down_proj = nn.Parameter(torch.empty(num, hidden, inter))


class SparseMoeBlock(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        h, e = cfg.hidden_size, cfg.num_experts
        self.num_experts, self.top_k = e, cfg.num_experts_per_tok
        self.norm_topk_prob = cfg.norm_topk_prob
        self.gate = nn.Linear(h, e, bias=False)  # the router (replicated on every rank)
        self.experts = Experts(e, h, cfg.moe_intermediate_size)
        # The global ids of the experts this rank holds, ascending (expert parallelism).
        self.local_experts: list[int] = list(range(e))
        self.shared_expert = self.shared_expert_gate = None
        if cfg.shared_expert_intermediate_size:
            self.shared_expert = SharedExpert(h, cfg.shared_expert_intermediate_size)
            self.shared_expert_gate = nn.Linear(h, 1, bias=False)
        bias = None
        if cfg.router_bias:
            bias = torch.zeros(e)
            for x, b in cfg.router_bias:
                bias[x] += b
        self.register_buffer("router_bias", bias, persistent=False)
        self.comm = None  # expert/tensor parallelism: sums the ranks' partial outputs
        self.loads: torch.Tensor | None = None  # [E] tokens routed to each expert, last forward

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights [T, k] in x's dtype, expert ids [T, k]) of every token."""
        logits = self.gate.forward(x)
        if self.router_bias is not None:
            logits = logits + self.router_bias.to(logits.dtype)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(x.dtype), ids

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.route(x)
        flat = ids.flatten()  # [T·k], token t's choices at t·k .. t·k + k - 1
        counts = torch.bincount(flat, minlength=self.num_experts)
        self.loads = counts
        order = torch.argsort(flat, stable=True)  # choices grouped by expert, ascending
        out = torch.zeros_like(x)
        w_flat = weights.flatten()
        # The split sizes on the host: one read per layer (a grouped GEMM would avoid it).
        n = counts.tolist()
        starts = [0]
        for c in n[:-1]:
            starts.append(starts[-1] + c)
        gate_up, down = self.experts.gate_up_proj, self.experts.down_proj
        for j, e in enumerate(self.local_experts):
            c = n[e]
            if c:
                sel = order[starts[e] : starts[e] + c]
                tok = sel // self.top_k
                g, u = F.linear(x[tok], gate_up[j]).chunk(2, dim=-1)
                y = F.linear(F.silu(g) * u, down[j]) * w_flat[sel, None]
                out.index_add_(0, tok, y)
        if self.shared_expert is not None:
            gate = torch.sigmoid(self.shared_expert_gate.forward(x))
            out = out + gate * self.shared_expert.forward(x)
        return out if self.comm is None else self.comm.all_reduce(out)


def expert_loads(model) -> torch.Tensor | None:
    """[layers, E] tokens per expert of the last forward, on the device (None: dense)."""
    loads = [layer.mlp.loads for layer in model.layers if isinstance(layer.mlp, SparseMoeBlock)]
    if not loads or any(x is None for x in loads):
        return None
    return torch.stack(loads)


def placement(num_experts: int, ranks: int, explicit: tuple[int, ...] = ()) -> list[int]:
    """The rank holding each expert: `explicit` when given (EngineConfig.expert_placement),
    else E / ranks contiguous experts per rank."""
    if explicit:
        return list(explicit)
    per = num_experts // ranks
    return [e // per for e in range(num_experts)]
