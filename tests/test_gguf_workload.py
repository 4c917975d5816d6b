"""Real-model workloads: built-in prompt sets of real text, chat-templated by the target,
output lengths from EOS unless --output-len forces them; bad model options are one line."""

from __future__ import annotations

from perfdiag.probes.prompt_sets import PROMPT_SETS
from perfdiag.probes.workload import LengthSpec, plan
from perfdiag.probes.workload_library import load_workload, override


def test_chat_real_plans_real_prompts_that_end_on_eos():
    spec = load_workload("chat-real")
    planned = list(plan(spec, vocab_size=49152))
    assert len(planned) == spec.requests
    assert all(r.chat and r.stop_at_eos and r.prompt_ids is None for r in planned)
    texts = [r.prompt_text for r in planned]
    assert set(texts) <= set(PROMPT_SETS["chat"])
    assert len(set(texts)) == len(texts)  # a round uses every prompt once before repeating
    assert texts == [r.prompt_text for r in list(plan(spec, vocab_size=49152))]  # seeded
    assert texts != [r.prompt_text for r in list(plan(override(spec, seed=1), vocab_size=49152))]


def test_output_len_given_forces_lengths():
    spec = override(load_workload("chat-real"), output_len=LengthSpec.parse("8"))
    assert not spec.stop_at_eos
    assert all(r.max_tokens == 8 and not r.stop_at_eos for r in list(plan(spec, 49152)))


def test_bad_model_options_are_one_line(tmp_path, cli):
    for args, needle in (
        (["--model-file", tmp_path / "absent.gguf"], "no such file"),
        (["--preset", "tiny", "--weights", "q3_k"], "weights 'q3_k' is not one of"),
        (["--preset", "nope"], "smollm2-135m"),
    ):
        r = cli("run", *args, "-n", "1", "-q", "-o", tmp_path / "run")
        assert r.returncode == 1, r.stderr
        assert needle in r.stderr and "Traceback" not in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
