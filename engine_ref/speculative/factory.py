"""The proposer an engine config asks for (`EngineConfig.speculative`), or None."""

from __future__ import annotations

from ...errors import ConfigError
from ..config import EngineConfig
from .ngram import NgramProposer
from .proposer import Proposer


def make_proposer(config: EngineConfig) -> Proposer | None:
    spec = config.speculative
    if spec is None:
        return None
    if spec.method == "ngram":
        return NgramProposer()
    try:
        from .draft_model import DraftModelProposer
    except ImportError:
        raise ConfigError(
            "--speculative draft: the draft-model proposer is not in this build; use ngram:K"
        ) from None
    return DraftModelProposer.from_target(config, spec.draft)
