"""Bad GGUF input gets one clear line (CheckpointError / ConfigError), never a traceback."""

from __future__ import annotations

import pytest

gguf = pytest.importorskip("gguf", reason="the `models` extra (gguf) reads GGUF files")

from perfdiag.engine_ref.config import EngineConfig, ModelConfig  # noqa: E402
from perfdiag.engine_ref.gguf_loader import read_gguf_config  # noqa: E402
from perfdiag.engine_ref.loader import CheckpointError  # noqa: E402
from perfdiag.errors import ConfigError  # noqa: E402


def write_gguf(path, arch: str) -> None:
    import numpy as np

    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_head_count(2)
    w.add_tensor("token_embd.weight", np.zeros((16, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_missing_file(tmp_path):
    with pytest.raises(CheckpointError, match="no such file"):
        read_gguf_config(tmp_path / "absent.gguf")


def test_not_a_gguf_file(tmp_path):
    p = tmp_path / "junk.gguf"
    p.write_bytes(b"this is not a GGUF file at all" * 10)
    with pytest.raises(CheckpointError, match="not a readable GGUF file"):
        read_gguf_config(p)


def test_another_architecture(tmp_path):
    p = tmp_path / "gpt2.gguf"
    write_gguf(p, "gpt2")
    with pytest.raises(CheckpointError, match="architecture 'gpt2' unsupported"):
        read_gguf_config(p)


def test_llama_file_missing_fields(tmp_path):
    p = tmp_path / "partial.gguf"
    write_gguf(p, "llama")
    with pytest.raises(CheckpointError, match=r"llama\.feed_forward_length is missing"):
        read_gguf_config(p)


def test_unknown_weight_format():
    with pytest.raises(ConfigError, match="weights 'q3_k' is not one of"):
        EngineConfig(model=ModelConfig.preset("tiny"), weight_format="q3_k")


def test_unknown_preset_lists_the_file_preset():
    with pytest.raises(ConfigError, match="smollm2-135m"):
        ModelConfig.preset("smollm3")
