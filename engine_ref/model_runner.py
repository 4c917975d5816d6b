"""Turns a scheduled batch into tensors, runs the model over the paged cache, samples.

Batch layout: every scheduled token of every request flattened into one [T] vector;
single-token requests (decodes) first, then prefill chunks. Request r with `start =
r.num_computed_tokens` computes tokens [start, start + n) at those positions, writing their
K/V to `slot = block_table[pos // block_size] * block_size + pos % block_size`. A request
samples when the step computes its last known token.

Speculative decoding: a decode with k draft tokens computes its last token and the drafts
(k + 1 positions, laid out like a prefill chunk) and keeps the logits of all k + 1; its
rows follow the plain sampling rows (`verify_reqs`, `drafts`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from .attention import AttentionMetadata, PrefillSlice
from .block_manager import BlockManager
from .kv_cache import KVCache
from .model import LlamaModel
from .request import Request
from .sampler import Sampler
from .speculative.rejection import Verified, verify


class StepPlan(NamedTuple):
    """A step's batch as plain lists: what `build` turns into tensors. Tensor-parallel
    workers receive it from rank 0 (parallel.py) and build the same tensors."""

    ids: list[int]
    pos: list[int]
    slots: list[int]
    decode_tables: list[list[int]]  # used blocks of each decode
    decode_ctx: list[int]
    prefills: list[tuple[int, int, int, int, list[int]]]  # offset, start, end, n, used blocks
    sample_idx: list[int]
    num_context: int


@dataclass
class ModelInput:
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    batch: list[tuple[Request, int]]  # in batch order
    sample_idx: torch.Tensor  # index of the last token of each request that samples
    sample_reqs: list[Request]
    num_context_tokens: int
    plan: StepPlan | None = None
    verify_reqs: list[Request] = field(default_factory=list)  # after sample_reqs' rows
    drafts: list[list[int]] = field(default_factory=list)  # per verify request


class ModelRunner:
    def __init__(
        self,
        model: LlamaModel,
        kv_cache: KVCache,
        block_size: int,
        sampler: Sampler,
        guard: BlockManager | None = None,
    ) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.block_size = block_size
        self.sampler = sampler
        self.device = kv_cache.device
        self.guard = guard  # a block manager in check mode vets every block a step touches
        # The Triton kernels read int32 tables and lengths built per step (KernelMeta).
        self.triton_kernels = model.kernel_backend == "triton"
        self.num_sms = 0  # decode attention splits along the sequence only on a GPU
        if self.triton_kernels and self.device.type == "cuda":
            self.num_sms = torch.cuda.get_device_properties(self.device).multi_processor_count
        self.graphs = None  # cuda_graphs.DecodeGraphs: replays decode-only steps

    def prepare(
        self, scheduled: list[tuple[Request, int]], drafts: dict[str, list[int]] | None = None
    ) -> ModelInput:
        """`drafts`: draft tokens by request id, for decodes the step verifies."""
        bs = self.block_size
        drafts = drafts or {}
        scheduled = [(r, n + len(drafts.get(r.request_id, ()))) for r, n in scheduled]
        batch = [x for x in scheduled if x[1] == 1] + [x for x in scheduled if x[1] > 1]
        verify_idx: list[int] = []
        verify_reqs: list[Request] = []
        ids: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        sample_idx: list[int] = []
        sample_reqs: list[Request] = []
        decode_tables: list[list[int]] = []
        decode_ctx: list[int] = []
        prefills: list[tuple[int, int, int, int, list[int]]] = []
        num_context = 0
        for r, n in batch:
            start, end, bt = r.num_computed_tokens, r.num_computed_tokens + n, r.block_table
            offset = len(ids)
            draft = drafts.get(r.request_id)
            if draft:  # the last token, then the drafts: every position is verified
                ids.append(r.all_token_ids[start])
                ids.extend(draft)
                verify_idx.extend(range(offset, offset + n))
                verify_reqs.append(r)
            else:
                ids.extend(r.all_token_ids[start:end])
            pos.extend(range(start, end))
            new_slots = [bt[p // bs] * bs + p % bs for p in range(start, end)]
            slots.extend(new_slots)
            used = bt[: -(-end // bs)]
            num_context += end
            if n == 1:
                decode_tables.append(used)
                decode_ctx.append(end)
            else:
                prefills.append((offset, start, end, n, used))
            if end == r.num_tokens and not draft:
                sample_idx.append(offset + n - 1)
                sample_reqs.append(r)
            if self.guard is not None:
                self.guard.check_access(r.request_id, used, {s // bs for s in new_slots})
                self.guard.pin(used)
        plan = StepPlan(ids, pos, slots, decode_tables, decode_ctx, prefills,
                        sample_idx + verify_idx, num_context)  # fmt: skip
        inp = self.build(plan, batch, sample_reqs)
        inp.verify_reqs = verify_reqs
        inp.drafts = [drafts[r.request_id] for r in verify_reqs]
        return inp

    def build(self, plan: StepPlan, batch=None, sample_reqs=None) -> ModelInput:
        """The step's tensors on this runner's device, from its plan."""
        bs, dev = self.block_size, self.device
        decode_tables, decode_ctx = plan.decode_tables, plan.decode_ctx
        prefills: list[PrefillSlice] = []
        for offset, start, end, n, used in plan.prefills:
            mask = None
            if start:  # queries at start.. attend to keys 0..their own position
                q = torch.arange(start, end, device=dev)[:, None]
                mask = torch.arange(end, device=dev)[None, :] <= q
            ids_t = torch.tensor(used, dtype=torch.long, device=dev)
            prefills.append(PrefillSlice(offset, offset + n, end, ids_t, mask))
        tables = ctx_mask = None
        if decode_tables:
            width = max(len(t) for t in decode_tables)
            # Pad with the request's own last block: the masked padding reads nothing foreign.
            padded = [t + [t[-1]] * (width - len(t)) for t in decode_tables]
            tables = torch.tensor(padded, dtype=torch.long, device=dev)
            if min(decode_ctx) != max(decode_ctx):
                ctx = torch.tensor(decode_ctx, device=dev)
                ctx_mask = torch.arange(width * bs, device=dev)[None, :] < ctx[:, None]
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(plan.slots, dtype=torch.long, device=dev),
            num_decode=len(decode_tables),
            decode_block_tables=tables,
            decode_mask=ctx_mask,
            decode_context_len=max(decode_ctx, default=0),
            prefills=prefills,
        )
        if self.triton_kernels:
            from .kernels.backend import build_kernel_meta

            meta.kernel = build_kernel_meta(
                decode_tables, decode_ctx, [r[4] for r in plan.prefills],
                [r[3] for r in plan.prefills], [r[2] for r in plan.prefills], dev,
                self.model.config.num_kv_heads, self.num_sms,
            )  # fmt: skip
        return ModelInput(
            input_ids=torch.tensor(plan.ids, dtype=torch.long, device=dev),
            positions=torch.tensor(plan.pos, dtype=torch.long, device=dev),
            meta=meta,
            batch=[] if batch is None else batch,
            sample_idx=torch.tensor(plan.sample_idx, dtype=torch.long, device=dev),
            sample_reqs=[] if sample_reqs is None else sample_reqs,
            num_context_tokens=plan.num_context,
            plan=plan,
        )

    @torch.inference_mode()
    def forward(self, inp: ModelInput, all_logits: bool = False) -> torch.Tensor:
        """fp32 logits of the sampling positions (or of every token, for tests)."""
        if self.graphs is not None and not all_logits:
            logits = self.graphs.run(inp)  # None: not a decode-only step of a captured size
            if logits is not None:
                return logits
        hidden = self.model(inp.input_ids, inp.positions, self.kv_cache.layers, inp.meta)
        if not all_logits:
            hidden = hidden[inp.sample_idx]
        return self.model.compute_logits(hidden)

    def sample(self, logits: torch.Tensor, inp: ModelInput) -> tuple[list[int], list[float]]:
        reqs = inp.sample_reqs
        if not reqs:
            return [], []
        return self.sampler(
            logits[: len(reqs)], [r.params for r in reqs], [r.generator for r in reqs]
        )

    def verify(
        self, logits: torch.Tensor, inp: ModelInput, draft_probs: list | None = None
    ) -> list[Verified]:
        """Rejection-sample the verified requests' drafts (their rows follow the plain
        sampling rows); `draft_probs` per verify request, None for one-hot drafts."""
        if not inp.verify_reqs:
            return []
        probs = draft_probs or [None] * len(inp.verify_reqs)
        return verify(logits[len(inp.sample_reqs) :], inp.verify_reqs, inp.drafts, probs,
                      self.sampler.generator)  # fmt: skip

    def release(self) -> None:
        """The step's reads and writes are done (sampling synchronised with the device)."""
        if self.guard is not None:
            self.guard.unpin_all()
