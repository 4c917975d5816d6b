"""Requests into the engine, from any thread: validated and tokenized on the caller's
thread, then queued with the aborts and applied only while no step is in flight
(LLMEngine's lock), so an abort never frees KV that a running step still uses."""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from .block_manager import hash_root
from .hooks import NO_STEP, RequestEvent, RequestEventKind
from .request import InvalidRequestError, Request, RequestOutput, SamplingParams

K = RequestEventKind
Prompt = str | Sequence[int]


class RequestIntake:
    """LLMEngine's requests-in half (a mixin: the state is LLMEngine's)."""

    def add_request(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        arrival_ns: int | None = None,
        cache_salt: str | None = None,
    ) -> str:
        """Queue a request; raises InvalidRequestError (and changes nothing) if it is bad."""
        arrival = time.monotonic_ns() if arrival_ns is None else int(arrival_ns)
        rid = f"req-{next(self._ids)}" if request_id is None else str(request_id)
        obs = self.observer
        if obs is not None:
            n = len(prompt) if isinstance(prompt, Sequence) and not isinstance(prompt, str) else 0
            obs.on_request(RequestEvent(rid, K.ARRIVED, arrival, NO_STEP, n))
        try:
            req = self._make_request(rid, prompt, params, arrival, cache_salt)
        except InvalidRequestError as e:
            if obs is not None:
                ts = time.monotonic_ns()
                obs.on_request(
                    RequestEvent(rid, K.FINISHED, ts, NO_STEP, 0, detail=f"rejected: {e}")
                )
            raise
        if obs is not None:
            ts = time.monotonic_ns()
            obs.on_request(RequestEvent(rid, K.TOKENIZED, ts, NO_STEP, req.num_prompt_tokens))
        self.requests[rid] = req
        self._inbox.append(req)
        self._apply_queued_if_idle()
        return rid

    def _make_request(self, rid, prompt, params, arrival, cache_salt) -> Request:
        if rid in self.requests:
            raise InvalidRequestError(f"request id {rid!r} is already in use")
        params = SamplingParams() if params is None else params
        if not isinstance(params, SamplingParams):
            raise InvalidRequestError("params must be a SamplingParams")
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt) if prompt else []  # no BOS-only "prompt"
        elif isinstance(prompt, Sequence) and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt
        ):
            ids = list(prompt)
        else:
            raise InvalidRequestError("prompt must be a str or a sequence of int token ids")
        vocab, max_len = self.config.model.vocab_size, self.config.max_model_len
        if not ids:
            raise InvalidRequestError("empty prompt")
        if len(ids) >= max_len:
            raise InvalidRequestError(
                f"prompt of {len(ids)} tokens leaves no room to generate (max_model_len {max_len})"
            )
        bad = next((t for t in (*ids, *params.stop_token_ids) if not 0 <= t < vocab), None)
        if bad is not None:
            raise InvalidRequestError(f"token id {bad} outside the vocabulary [0, {vocab})")
        max_total = min(len(ids) + params.max_tokens, max_len)
        bm = self.block_manager
        if bm.blocks_for(max_total) > bm.num_blocks - self.watermark_blocks:
            raise InvalidRequestError(
                f"up to {max_total} tokens need {bm.blocks_for(max_total)} KV blocks; the pool "
                f"has {bm.num_blocks - self.watermark_blocks} to give"
            )
        gen = None
        if params.seed is not None:
            gen = torch.Generator(device=self.device).manual_seed(params.seed)
        return Request(
            request_id=rid,
            prompt_token_ids=tuple(ids),
            params=params,
            arrival_ns=arrival,
            max_total_tokens=max_total,
            eos_token_ids=self.eos_token_ids,
            hash_root=hash_root(self.fingerprint, cache_salt),
            generator=gen,
        )

    def abort(self, request_id: str) -> bool:
        """Cancel a request in any state. Its resources are released now if no step is
        running, else when the running step ends. False if unknown or already finished."""
        req = self.requests.get(request_id)
        if req is None or req.status.is_finished or request_id in self._aborting:
            return False
        self._aborting.add(request_id)
        obs = self.observer
        if obs is not None:
            ts = time.monotonic_ns()
            obs.on_request(RequestEvent(request_id, K.ABORTED, ts, NO_STEP, req.num_output_tokens))
        self._aborts.append(request_id)
        self._apply_queued_if_idle()
        return True

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests or self._outputs or self._inbox)

    def _apply_queued_if_idle(self) -> None:
        if self._lock.acquire(blocking=False):
            try:
                self._apply_queued(NO_STEP)
            finally:
                self._lock.release()

    def _apply_queued(self, step_id: int) -> None:
        """Move queued requests into the scheduler and apply queued aborts (lock held, no
        step in flight)."""
        obs = self.observer
        while self._inbox:
            req = self._inbox.popleft()
            self.scheduler.add(req)
            if obs is not None:
                ts = time.monotonic_ns()
                obs.on_request(
                    RequestEvent(req.request_id, K.QUEUED, ts, step_id, req.num_prompt_tokens)
                )
        while self._aborts:
            rid = self._aborts.popleft()
            self._aborting.discard(rid)
            req = self.requests.pop(rid, None)
            if req is None or req.status.is_finished:  # it finished on its own meanwhile
                continue
            self.scheduler.abort(req)
            self._outputs.append(
                RequestOutput(req.request_id, [], [], req.num_output_tokens, True, "abort")
            )
            if obs is not None:
                ts = time.monotonic_ns()
                obs.on_request(
                    RequestEvent(
                        req.request_id,
                        K.FINISHED,
                        ts,
                        step_id,
                        req.num_output_tokens,
                        detail="abort",
                    )
                )
