"""Pipeline parallelism's two splits, shared by rank 0 (pipeline.py) and the stage workers
(pipeline_worker.py): the model's layers into stages, and a step's plan into micro-batches.

A micro-batch is a run of whole requests (never part of one: a request's attention reads
only its own KV, so splitting between requests changes no arithmetic of a request), cut
where the tokens are most even; decodes stay before prefills, as `ModelRunner.prepare`
lays them out, so the micro-batches' sampled rows concatenate into the step's order.
"""

from __future__ import annotations

import dataclasses
import itertools

import torch

from .model_runner import StepPlan


def stage_layers(num_layers: int, stages: int, split: tuple[int, ...] = ()) -> list[range]:
    """The layers of each stage: `split` gives each stage's count (empty: as even as
    possible, the earlier stages taking the remainder's extra layer)."""
    counts = list(split) or [num_layers // stages + (s < num_layers % stages)
                             for s in range(stages)]  # fmt: skip
    out, first = [], 0
    for n in counts:
        out.append(range(first, first + n))
        first += n
    return out


def stage_model_config(cfg, layers: range):
    """The model config of one stage: its layers only (the KV pool holds those)."""
    return dataclasses.replace(cfg, num_layers=len(layers))


def largest_stage_config(config):
    """The model config of the stage with the most layers: every stage's pool has the
    same block count (rank 0's block ids mean the same everywhere), sized to fit it."""
    stages = stage_layers(config.model.num_layers, config.pipeline_parallel_size,
                          config.pipeline_layers)  # fmt: skip
    return stage_model_config(config.model, max(stages, key=len))


def keep_stage(model, layers: range) -> None:
    """Drop every layer but this stage's, in place (embeddings, norm and head are kept:
    stage 0 embeds, the last stage norms, rank 0 computes the logits)."""
    model.layers = torch.nn.ModuleList(model.layers[i] for i in layers)


@torch.inference_mode()
def stage_forward(model, x: torch.Tensor, positions, kv_layers, meta, first: bool, last: bool):
    """This stage's layers over one micro-batch: token ids in on the first stage (else the
    previous stage's residual stream [T, hidden]), the normed final hidden states out on
    the last (else the residual stream for the next stage). The model's layers add their
    residual in place of vLLM's separate (hidden, residual) pair: one tensor crosses."""
    if first:
        x = model.embed_tokens(x)
    cos, sin = model.rotary(positions, x.dtype if first else model.norm.weight.dtype)
    for layer, kv in zip(model.layers, kv_layers, strict=True):
        x = layer.forward(x, cos, sin, kv, meta)
    return model.norm.forward(x) if last else x


def split_plan(plan: StepPlan, m: int) -> list[StepPlan]:
    """The step's plan as at most `m` micro-batch plans of whole requests, cut where the
    cumulative tokens cross k/m of the total (fewer when the step has fewer requests)."""
    n_dec = len(plan.decode_tables)
    # each request: (offset, tokens, decode index or prefill index)
    reqs = [(i, 1, ("d", i)) for i in range(n_dec)]
    reqs += [(p[0], p[3], ("p", j)) for j, p in enumerate(plan.prefills)]
    m = max(1, min(m, len(reqs)))
    total = sum(r[1] for r in reqs)
    cuts, seen, k = [0], 0, 1
    for i, r in enumerate(reqs):
        # cut before request i once k/m of the tokens lie before it, or when the
        # requests left are only enough for the groups left
        if k < m and i > cuts[-1] and (seen * m >= k * total or len(reqs) - i == m - k):
            cuts.append(i)
            k += 1
        seen += r[1]
    cuts.append(len(reqs))
    groups = [reqs[a:b] for a, b in itertools.pairwise(cuts)]
    sample = set(plan.sample_idx)
    return [_sub_plan(plan, g, sample) for g in groups]


def _sub_plan(plan: StepPlan, group: list, sample: set[int]) -> StepPlan:
    ids, pos, slots, tables, ctx, prefills, sample_idx = [], [], [], [], [], [], []
    num_context = 0
    for offset, n, (kind, i) in group:
        new = len(ids)
        ids += plan.ids[offset : offset + n]
        pos += plan.pos[offset : offset + n]
        slots += plan.slots[offset : offset + n]
        if kind == "d":
            tables.append(plan.decode_tables[i])
            ctx.append(plan.decode_ctx[i])
            num_context += plan.decode_ctx[i]
        else:
            _, start, end, _, used = plan.prefills[i]
            prefills.append((new, start, end, n, used))
            num_context += end
        sample_idx += [new + (j - offset) for j in range(offset, offset + n) if j in sample]
    return StepPlan(ids, pos, slots, tables, ctx, prefills, sample_idx, num_context)
