"""The reference inference engine that perfdiag's probes record and its playbooks diagnose.

    from perfdiag.engine_ref import EngineConfig, LLMEngine, ModelConfig, SamplingParams
    engine = LLMEngine(EngineConfig(model=ModelConfig.preset("tiny")))
    engine.generate(["Hello"], SamplingParams(temperature=0, max_tokens=8))

Configs, requests and hook events import without torch; the engine itself (torch) loads on
first use of `LLMEngine`, `AsyncLLMEngine`, `DenseReference` or `build_model`.
See docs/engine_ref.md.
"""

from .config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from .hooks import (
    EngineObserver,
    PhaseEvent,
    RecordingObserver,
    RequestEvent,
    RequestEventKind,
    StepBegin,
    StepEvent,
    StepPhase,
)
from .request import (
    CompletionOutput,
    InvalidRequestError,
    RequestOutput,
    RequestStatus,
    SamplingParams,
)

_LAZY = {
    "LLMEngine": ".engine",
    "build_model": ".engine",
    "AsyncLLMEngine": ".async_engine",
    "DenseReference": ".reference",
    "CheckpointError": ".loader",
}

__all__ = [
    "AsyncLLMEngine",
    "CacheConfig",
    "CheckpointError",
    "CompletionOutput",
    "DenseReference",
    "EngineConfig",
    "EngineObserver",
    "InvalidRequestError",
    "LLMEngine",
    "ModelConfig",
    "PhaseEvent",
    "RecordingObserver",
    "RequestEvent",
    "RequestEventKind",
    "RequestOutput",
    "RequestStatus",
    "SamplingParams",
    "SchedulerConfig",
    "StepBegin",
    "StepEvent",
    "StepPhase",
    "build_model",
]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
