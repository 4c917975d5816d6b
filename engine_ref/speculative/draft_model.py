"""The draft-model proposer: a small model sharing the target's tokenizer drafts K tokens.

The draft keeps its own paged KV (its own KVCache and BlockManager, sized by
draft_config.py) and a shadow sequence per request id: the request's true tokens plus its
own drafts, with `num_computed_tokens` counting those whose KV it holds. Each `propose`:
1. syncs every shadow with the request's true tokens: KV past the longest prefix still
   true (rejected drafts) is dropped, and at least the last true token is left to compute;
2. one forward over what each request has not cached (the prompt on first sight, then the
   1-2 tokens the target appended), all requests in one batch, sampling draft 1;
3. K-1 batched single-token forwards, sampling drafts 2..K.
Blocks for the K-1 fed drafts are taken up front; a request that does not fit the draft's
pool gets fewer drafts, or none: the target is never failed by its draft.

Sampling: a greedy request takes the draft's argmax and its Proposal has probs None (a
one-hot q: for a greedy target, verification only compares argmaxes, so a [K, vocab] copy
would be pure cost). Any other request draws from the draft's distribution under its own
temperature / top-k / top-p, and gets those distributions in Proposal.probs (float32
[n, vocab], on the draft's device) for the target's rejection-sampling correction. A
seeded request draws from its own draft generator (seeded from its seed), so its drafts do
not depend on what shares its batch.

Assumes what the engine guarantees: a request's tokens only grow while it runs; a
preempted, aborted or finished request is `release`d before its id is seen again.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..block_manager import BlockManager
from ..config import EngineConfig
from ..engine_build import build_model, local_kv_blocks
from ..kv_cache import KVCache
from ..model import LlamaModel
from ..model_runner import ModelRunner
from ..request import Request
from ..sampler import Sampler, apply_top_k_top_p
from .draft_config import draft_engine_config
from .proposer import Proposal

# Derives a seeded request's draft seed from its own, so the draft's draws are not the
# target's (a shared stream would correlate draft and verification noise).
_DRAFT_SEED_MIX = 0x9E3779B97F4A7C15


class DraftSeq(Request):
    """A request as the draft sees it: true tokens + drafts; `synced` true tokens at the
    last sync (the drafts start there)."""

    synced: int = 0


class DraftModelProposer:
    name = "draft"

    def __init__(self, config: EngineConfig, model: LlamaModel | None = None) -> None:
        """`config` is the draft's own (draft_config.draft_engine_config builds it)."""
        self.config = config
        cc = config.cache
        self.device = torch.device(config.device)
        num_blocks = local_kv_blocks(config)[0]
        self.model = model if model is not None else build_model(config)
        self.kv_cache = KVCache(config.model, num_blocks, cc.block_size, 0, self.device,
                                config.dtype)  # fmt: skip
        self.block_manager = BlockManager(
            num_blocks, cc.block_size, 0, False, self.kv_cache, check=cc.check_ownership
        )
        guard = self.block_manager if cc.check_ownership else None
        sampler = Sampler(self.device, config.seed)  # unused: drafts sample below, with probs
        self.runner = ModelRunner(self.model, self.kv_cache, cc.block_size, sampler, guard)
        self.generator = torch.Generator(device=self.device).manual_seed(config.seed)
        self.max_len = config.max_model_len
        self.seqs: dict[str, DraftSeq] = {}

    @classmethod
    def from_target(
        cls, target: EngineConfig, draft: str, draft_kv_mb: float | None = None
    ) -> DraftModelProposer:
        """The proposer for `--speculative draft:DRAFT:K` on an engine of `target`."""
        return cls(draft_engine_config(target, draft, draft_kv_mb))

    # ---- the contract ---------------------------------------------------------------------
    @torch.inference_mode()
    def propose(self, requests: Sequence[Request], k: int) -> list[Proposal]:
        out = [Proposal([]) for _ in requests]
        want: dict[str, int] = {}  # request id -> drafts it gets
        index: dict[str, int] = {}
        params = {}
        for i, r in enumerate(requests):
            n = self._prepare(r, k)
            if n:
                want[r.request_id], index[r.request_id] = n, i
                params[r.request_id] = r.params
        drafts: dict[str, list[int]] = {rid: [] for rid in want}
        probs: dict[str, list[torch.Tensor]] = {rid: [] for rid in want}
        live = [self.seqs[rid] for rid in want]
        while live:
            batch = [(s, s.num_tokens - s.num_computed_tokens) for s in live]
            inp = self.runner.prepare(batch)
            try:
                logits = self.runner.forward(inp)
            finally:
                self.runner.release()
            seqs = inp.sample_reqs  # batch order: decodes first
            tokens, q = self._sample(logits, seqs, [params[s.request_id] for s in seqs])
            for s, tok, row in zip(seqs, tokens, q, strict=True):
                s.num_computed_tokens = s.num_tokens
                s.all_token_ids.append(tok)
                drafts[s.request_id].append(tok)
                if row is not None:
                    probs[s.request_id].append(row)
            live = [s for s in seqs if len(drafts[s.request_id]) < want[s.request_id]]
        for rid, toks in drafts.items():
            rows = probs[rid]
            out[index[rid]] = Proposal(toks, torch.stack(rows) if rows else None)
        return out

    def accepted(self, request: Request) -> None:
        s = self.seqs.get(request.request_id)
        if s is not None:
            self._trim(s, self._true_prefix(s, request.all_token_ids))

    def release(self, request_id: str) -> None:
        s = self.seqs.pop(request_id, None)
        if s is not None:
            self.block_manager.free(s)

    # ---- bookkeeping ------------------------------------------------------------------------
    def _prepare(self, r: Request, k: int) -> int:
        """Sync `r`'s shadow and take blocks for its drafts: how many it gets (0: none)."""
        truth = r.all_token_ids
        n = len(truth)
        # Drafts past what the request may still emit are wasted: the target adds one of
        # its own. The draft computes positions up to n + K - 2.
        want = min(k, r.max_total_tokens - n - 1, self.max_len - n + 1)
        s = self.seqs.get(r.request_id)
        if want < 1 and s is None:
            return 0
        if s is None:
            s = DraftSeq(r.request_id, (), r.params, 0, r.max_total_tokens)
            if r.params.seed is not None:
                s.generator = torch.Generator(device=self.device)
                s.generator.manual_seed((r.params.seed * _DRAFT_SEED_MIX + 1) % 2**63)
        keep = min(self._true_prefix(s, truth), n - 1)
        self._trim(s, keep)
        del s.all_token_ids[keep:]
        s.all_token_ids.extend(truth[keep:])
        s.synced = n
        bm = self.block_manager
        room = (len(s.block_table) + bm.num_free_blocks) * bm.block_size
        want = min(want, room - n + 1)  # the KV for n + want - 1 tokens
        if want < 1:
            if s.block_table:
                self.seqs[r.request_id] = s  # keeps what it holds: it may fit next step
            return 0
        self.seqs[r.request_id] = s
        bm.append_slots(s, n + want - 1 - keep)
        return want

    @staticmethod
    def _true_prefix(s: DraftSeq, truth: Sequence[int]) -> int:
        """How many of the shadow's cached tokens are still `truth`'s: the tokens before
        `synced` were true at the last sync and true tokens only grow, so only the drafts
        after it are compared."""
        mine, i = s.all_token_ids, min(s.synced, s.num_computed_tokens)
        end = min(s.num_computed_tokens, len(truth))
        while i < end and mine[i] == truth[i]:
            i += 1
        return i

    def _trim(self, s: DraftSeq, keep: int) -> None:
        """Forget the KV of tokens from `keep` on; free the blocks past the last kept one."""
        s.num_computed_tokens = min(s.num_computed_tokens, keep)
        held = self.block_manager.blocks_for(keep)
        if len(s.block_table) > held:
            head, s.block_table = s.block_table[:held], s.block_table[held:]
            self.block_manager.free(s)  # frees exactly the tail
            s.block_table = head

    def _sample(
        self, logits: torch.Tensor, seqs: list[DraftSeq], params
    ) -> tuple[list[int], list[torch.Tensor | None]]:
        """Draft tokens for each row, and each non-greedy row's distribution (float32)."""
        tokens = logits.argmax(-1)
        dists: list[torch.Tensor | None] = [None] * len(seqs)
        rows = [i for i, p in enumerate(params) if not p.greedy]
        if rows:
            dev = logits.device
            idx = torch.tensor(rows, device=dev)
            temps = torch.tensor([params[i].temperature for i in rows], device=dev)
            sel = logits[idx].float() / temps[:, None]
            if any(params[i].top_k > 0 or params[i].top_p < 1.0 for i in rows):
                top_k = torch.tensor([params[i].top_k for i in rows], device=dev)
                top_p = torch.tensor([params[i].top_p for i in rows], device=dev)
                sel = apply_top_k_top_p(sel, top_k, top_p)
            q = sel.softmax(-1)
            # argmax(q / Exp(1)) is a draw from q (as the engine's sampler draws).
            noise = torch.empty_like(q)
            for j, i in enumerate(rows):
                noise[j].exponential_(generator=seqs[i].generator or self.generator)
            noise.clamp_(min=torch.finfo(noise.dtype).tiny)
            tokens[idx] = (q / noise).argmax(-1)
            for j, i in enumerate(rows):
                dists[i] = q[j]
        return tokens.tolist(), dists
