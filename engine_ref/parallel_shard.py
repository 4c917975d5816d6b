"""One rank's shard of the model (Megatron's split; experts placed, not split) and the
timed all-reduce that sums the row-parallel partial outputs: parallel.py explains the
scheme, both rank 0 and the workers (parallel_worker.py) shard with this."""

from __future__ import annotations

import dataclasses
import time

import torch

from .moe import SparseMoeBlock, placement


def local_model_config(cfg, tp: int):
    """The model config of one rank's shard (heads and intermediate size divided)."""
    return dataclasses.replace(
        cfg,
        num_heads=cfg.num_heads // tp,
        num_kv_heads=cfg.num_kv_heads // tp,
        # a MoE model has no dense MLP: its experts are placed, not split (shard_moe)
        intermediate_size=cfg.intermediate_size // (1 if cfg.is_moe else tp),
        head_dim=cfg.head_dim,
    )


class TPComm:
    """The model's all-reduces on one rank, each timed on the host."""

    def __init__(self, group, rank: int, world: int) -> None:
        import torch.distributed as dist

        self._all_reduce = dist.all_reduce
        self.group = group
        self.rank = rank
        self.world = world
        # name, bytes, start, end, and the process's CPU time inside the call (the host
        # checks judge the CPU a rank got outside its collectives, where it computes)
        self.records: list[tuple[str, int, int, int, int]] = []

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        t0, c0 = time.monotonic_ns(), time.process_time_ns()
        self._all_reduce(x, group=self.group)
        t1, c1 = time.monotonic_ns(), time.process_time_ns()
        self.records.append(("all_reduce", x.numel() * x.element_size(), t0, t1, c1 - c0))
        return x

    def take(self) -> list[tuple[str, int, int, int, int]]:
        out, self.records = self.records, []
        return out


@torch.no_grad()
def shard_model(model, rank: int, tp: int, comm: TPComm | None,
                experts: tuple[int, ...] = ()) -> None:  # fmt: skip
    """Keep rank `rank`'s shard of every layer's weights, in place (`experts`: the expert
    placement, expert → rank; empty: contiguous)."""
    cfg = model.config
    h, kvh, d = cfg.num_heads // tp, cfg.num_kv_heads // tp, cfg.head_dim
    inter = cfg.intermediate_size // tp
    for layer in model.layers:
        a, m = layer.self_attn, layer.mlp
        q_rows = slice(rank * h * d, (rank + 1) * h * d)
        k0 = cfg.num_heads * d
        v0 = k0 + cfg.num_kv_heads * d
        kv = slice(rank * kvh * d, (rank + 1) * kvh * d)
        rows = torch.cat(
            [torch.arange(cfg.num_heads * d)[q_rows],
             torch.arange(k0, v0)[kv], torch.arange(v0, v0 + cfg.num_kv_heads * d)[kv]]
        )  # fmt: skip
        _set(a.qkv_proj, "weight", a.qkv_proj.weight[rows])
        if a.qkv_proj.bias is not None:
            _set(a.qkv_proj, "bias", a.qkv_proj.bias[rows])
        _set(a.o_proj, "weight", a.o_proj.weight[:, q_rows])
        if a.o_proj.bias is not None and rank != 0:  # added once, by rank 0's partial sum
            _set(a.o_proj, "bias", torch.zeros_like(a.o_proj.bias))
        a.num_heads, a.num_kv_heads = h, kvh
        a.q_size, a.kv_size = h * d, kvh * d
        if isinstance(m, SparseMoeBlock):
            shard_moe(m, rank, tp, placement(m.num_experts, tp, experts))
            a.comm = m.comm = comm
            continue
        cols = slice(rank * inter, (rank + 1) * inter)
        gate_up = m.gate_up_proj.weight
        i = cfg.intermediate_size
        _set(m.gate_up_proj, "weight", torch.cat([gate_up[:i][cols], gate_up[i:][cols]]))
        _set(m.down_proj, "weight", m.down_proj.weight[:, cols])
        a.comm = m.comm = comm


@torch.no_grad()
def shard_moe(m: SparseMoeBlock, rank: int, tp: int, where: list[int]) -> None:
    """Expert parallelism: keep the experts `where` (expert → rank) gives this rank (the
    router stays whole: every rank routes every token) and its column/row share of the
    shared expert, whose partial output joins the experts' in the block's one all_reduce."""
    m.local_experts = [e for e, r in enumerate(where) if r == rank]
    ids = torch.tensor(m.local_experts, dtype=torch.long)
    ex = m.experts
    _set(ex, "gate_up_proj", ex.gate_up_proj[ids])
    _set(ex, "down_proj", ex.down_proj[ids])
    if m.shared_expert is not None:
        s = m.shared_expert
        i = s.down_proj.weight.shape[1]
        cols = slice(rank * i // tp, (rank + 1) * i // tp)
        gate_up = s.gate_up_proj.weight
        _set(s.gate_up_proj, "weight", torch.cat([gate_up[:i][cols], gate_up[i:][cols]]))
        _set(s.down_proj, "weight", s.down_proj.weight[:, cols])


def _set(module, name: str, value: torch.Tensor) -> None:
    setattr(module, name, torch.nn.Parameter(value.contiguous(), requires_grad=False))
