"""engine_ref's GGUF reader against the `gguf` package's own reader on the real file, and
on files cut short."""

from __future__ import annotations

import numpy as np
import pytest
from smollm2_model import smollm2_path

PATH = smollm2_path()
gguf = pytest.importorskip("gguf")

from perfdiag.engine_ref.gguf_loader import read_gguf_config  # noqa: E402
from perfdiag.engine_ref.gguf_reader import GGUFFile  # noqa: E402
from perfdiag.engine_ref.loader import CheckpointError  # noqa: E402


def test_same_metadata_and_tensors_as_gguf_reader():
    ours, ref = GGUFFile(PATH), gguf.GGUFReader(str(PATH))
    assert set(ours.fields) == set(ref.fields) - {"GGUF.version", "GGUF.tensor_count",
                                                  "GGUF.kv_count"}  # fmt: skip
    for key in (
        "tokenizer.ggml.tokens",
        "tokenizer.ggml.merges",
        "tokenizer.ggml.token_type",
        "tokenizer.chat_template",
        "llama.rope.freq_base",
        "general.architecture",
    ):
        assert ours.fields[key] == ref.fields[key].contents(), key
    assert [t.name for t in ours.tensors] == [t.name for t in ref.tensors]
    for a, b in zip(ours.tensors, ref.tensors, strict=True):
        assert a.qtype == b.tensor_type.name and list(a.dims) == b.shape.tolist()
        assert a.data.shape == b.data.shape and np.array_equal(a.data, b.data)


@pytest.mark.parametrize("keep", [3, 200, 5_000_000])
def test_a_truncated_file_is_one_line(tmp_path, keep):
    cut = tmp_path / "cut.gguf"
    with open(PATH, "rb") as fh:
        cut.write_bytes(fh.read(keep))
    with pytest.raises(CheckpointError, match="not a readable GGUF file"):
        read_gguf_config(cut)
