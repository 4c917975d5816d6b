"""Overlapped scheduling on a real model (SmolLM2-135M, GGUF): the same tokens as the
plain engine, greedy and seeded, with a pool small enough to preempt and with aborts."""

from __future__ import annotations

import pytest
from smollm2_model import PROMPTS, smollm2_path

PATH = smollm2_path()
pytestmark = pytest.mark.slow  # two real-model runs each: 15-90 s on two shared cores

from perfdiag.engine_ref import (  # noqa: E402
    CacheConfig,
    EngineConfig,
    LLMEngine,
    RecordingObserver,
    SamplingParams,
    SchedulerConfig,
)
from perfdiag.engine_ref import RequestEventKind as K  # noqa: E402
from perfdiag.engine_ref.gguf_loader import read_gguf_config  # noqa: E402

PARAMS = [
    SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True),
    SamplingParams(temperature=0.9, top_p=0.95, seed=7, max_tokens=24, ignore_eos=True),
    SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True),
]


def _outputs(overlap: bool, abort_after: int | None = None):
    # 16 blocks of 4 tokens for three prompts of ~8 tokens growing by 16-24, no reserve:
    # the pool runs out while all three decode, so some are preempted.
    cfg = EngineConfig(model=read_gguf_config(PATH), model_path=str(PATH), max_model_len=512,
                       cache=CacheConfig(block_size=4, num_gpu_blocks=16, watermark=0.0),
                       scheduler=SchedulerConfig(decode_reserve_tokens=0),
                       async_scheduling=overlap)  # fmt: skip
    obs = RecordingObserver()
    engine = LLMEngine(cfg, observer=obs)
    tokens = {}
    for i, (prompt, p) in enumerate(zip(PROMPTS, PARAMS, strict=True)):
        tokens[engine.add_request(prompt, p, request_id=f"r{i}")] = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens[out.request_id].extend(out.new_token_ids)
            if abort_after and out.request_id == "r1" and len(tokens["r1"]) == abort_after:
                engine.abort("r1")
    assert engine.is_drained()
    return tokens, obs


@pytest.mark.parametrize("abort_after", [None, 5])
def test_smollm2_overlapped_equals_plain(abort_after):
    plain, _ = _outputs(False, abort_after)
    overlapped, obs2 = _outputs(True, abort_after)
    assert overlapped == plain
    if not abort_after:  # all three at full length overflow the pool
        assert any(e.kind == K.PREEMPTED for e in obs2.requests)
    else:
        assert len(plain["r1"]) == abort_after
