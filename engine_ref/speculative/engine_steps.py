"""LLMEngine's speculative half (a mixin: the state is LLMEngine's): drafts for the step's
running decodes, then the verified tokens applied (KV of rejected drafts rolled back) and
reported."""

from __future__ import annotations

import time

from ..hooks import PhaseEvent, RequestEvent, RequestEventKind, SpecDecodeEvent, StepPhase
from ..model_runner import ModelInput
from ..request import RequestOutput
from ..scheduler import SchedulerOutput
from .rejection import Verified


class SpeculativeSteps:
    def _draft(self, sched: SchedulerOutput, step_id: int, t_start: int):
        """Drafts (request id -> tokens), their draft probabilities (None: one-hot) for the
        decodes that have draft slots, and the draft phase's end (0: no phase, or nobody
        observes); slots no draft uses are freed at once."""
        lookahead = sched.lookahead
        if self.proposer is None or not lookahead:
            return {}, {}, 0
        by_k: dict[int, list] = {}
        for req, _ in sched.scheduled:
            k = lookahead.get(req.request_id)
            if k:
                by_k.setdefault(k, []).append(req)
        drafts, probs = {}, {}
        for k, reqs in by_k.items():  # usually one group: every request has K slots
            for req, prop in zip(reqs, self.proposer.propose(reqs, k), strict=True):
                tokens = list(prop.tokens[:k])
                if tokens:
                    drafts[req.request_id] = tokens
                    q = prop.probs
                    probs[req.request_id] = None if q is None else q[: len(tokens)]
                # Slots for the last token and the drafts it got, no more.
                self.block_manager.free_tail(req, req.num_tokens + len(tokens))
        t_end = 0
        if self.observer is not None:
            t_end = time.monotonic_ns()
            self.observer.on_phase(PhaseEvent(step_id, StepPhase.DRAFT, t_start, t_end))
        return drafts, probs, t_end

    def _apply_verified(self, inp: ModelInput, verified: list[Verified], step_id: int):
        """Append each verified request's emitted tokens (cut at a stop), keep the KV of
        the accepted ones and free the slots past it; RequestOutputs and the step's
        SpecDecodeEvents."""
        obs = self.observer
        ts = time.monotonic_ns() if obs is not None else 0
        bm, max_len = self.block_manager, self.config.max_model_len
        outputs, events = [], []
        for req, draft, v in zip(inp.verify_reqs, inp.drafts, verified, strict=True):
            prev, status, emitted = req.num_computed_tokens, None, 0
            for tok, lp in zip(v.tokens, v.logprobs, strict=True):
                req.append_token(tok, lp)
                emitted += 1
                status = req.check_stop(max_len)
                if obs is not None:
                    obs.on_request(RequestEvent(req.request_id, RequestEventKind.TOKEN, ts,
                                                step_id, req.num_output_tokens))  # fmt: skip
                if status is not None:
                    break
            # KV of the last token and the accepted drafts before the last emitted token.
            req.num_computed_tokens = prev + emitted
            bm.cache_full_blocks(req, prev)
            if status is None:
                bm.free_tail(req, req.num_computed_tokens)
                self.proposer.accepted(req)
            else:
                self.scheduler.finish(req, status)
                self.requests.pop(req.request_id, None)
                if obs is not None:
                    obs.on_request(RequestEvent(req.request_id, RequestEventKind.FINISHED, ts,
                                                step_id, req.num_output_tokens,
                                                detail=status.finish_reason))  # fmt: skip
            events.append(SpecDecodeEvent(step_id, req.request_id, len(draft), v.num_accepted,
                                          emitted))  # fmt: skip
            outputs.append(RequestOutput(req.request_id, v.tokens[:emitted],
                                         v.logprobs[:emitted], req.num_output_tokens,
                                         status is not None,
                                         status and status.finish_reason))  # fmt: skip
        return outputs, events
