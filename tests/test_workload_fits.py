"""Every built-in preset runs every built-in workload on any seed (issue 37 item 5: the
default `chat` asked `tiny` for up to 538 tokens of its 512 on seed 7, and
`long-prefill-mixed` overflowed it on every seed). A built-in's lengths are capped to the
model's context and the run says so; lengths a user gives are checked, never shortened."""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json

import pytest

from perfdiag.cli.run import build_options
from perfdiag.engine_ref.config import PRESETS
from perfdiag.engine_ref.preset_names import FILE_PRESETS, SMOLLM2_PACKAGE
from perfdiag.engine_ref.tokenizer import load_tokenizer
from perfdiag.errors import ConfigError
from perfdiag.probes.workload import LengthSpec, plan
from perfdiag.probes.workload_fit import capped, fit_to_context
from perfdiag.probes.workload_library import builtins, load_workload, override

SEEDS = range(20)
HAVE_SMOLLM2 = importlib.util.find_spec(SMOLLM2_PACKAGE) is not None


def _preset_param(name: str):
    if name in FILE_PRESETS and not HAVE_SMOLLM2:
        return pytest.param(name, marks=pytest.mark.skip(reason=f"{SMOLLM2_PACKAGE} missing"))
    return name


@functools.cache
def _engine(preset: str):
    """The engine configuration a run of this preset builds, and its tokenizer."""
    options, _ = build_options({"preset": preset})
    cfg = options.engine.engine_config()
    m = cfg.model
    return cfg, load_tokenizer(cfg.model_path, m.bos_token_id, (m.eos_token_ids or (None,))[0])


def _prompt_tokens(request, tokenizer) -> int:
    """As the in-process target sends it (probes/targets.py): ids, or text chat-templated
    by a real model's tokenizer, then tokenized by the engine."""
    if request.prompt_ids is not None:
        return len(request.prompt_ids)
    text = request.prompt_text
    template = getattr(tokenizer, "apply_chat_template", None)
    if request.chat and template is not None:
        text = template([{"role": "user", "content": text}])
    return len(tokenizer.encode(text))


@pytest.mark.parametrize("preset", [_preset_param(p) for p in [*PRESETS, *FILE_PRESETS]])
def test_every_builtin_workload_fits_every_preset_on_seeds_0_to_19(preset):
    cfg, tokenizer = _engine(preset)
    checked = 0
    for name in builtins():
        for seed in SEEDS:
            options, _ = build_options({"preset": preset, "workload": name, "seed": seed})
            spec, _ = fit_to_context(options.workload, cfg.max_model_len)
            for r in plan(spec, cfg.model.vocab_size):
                need = _prompt_tokens(r, tokenizer) + r.max_tokens
                assert need <= cfg.max_model_len, (preset, name, seed, r.request_id, need)
                checked += 1
    assert checked > 1000


def test_a_workload_that_fits_is_left_alone():
    spec = load_workload("chat")
    fitted, fit = fit_to_context(spec, 2048)
    assert fitted is spec and not fit.changed


def test_the_prompt_is_capped_first_and_the_other_draws_are_unchanged():
    spec = dataclasses.replace(load_workload("chat"), seed=7)
    fitted, fit = fit_to_context(spec, 512)
    assert (fit.prompt_cap, fit.prompt_was, fit.output_cap) == (448, 512, None)
    assert fitted.output_len == spec.output_len and fitted.prompt_len.high == 448
    before, after = list(plan(spec, 259)), list(plan(fitted, 259))
    longer = [a for a, b in zip(after, before, strict=True) if a.prompt_len != b.prompt_len]
    assert longer and all(a.prompt_len == 448 for a in longer)  # seed 7 drew 474 once
    assert all(b.prompt_len > 448 for b in before if b.request_id in {a.request_id for a in longer})

    # lengths and send times are the same draws; only the random token ids of the prompts
    # after a capped one move (they come from one stream)
    def shape(r):
        return (min(r.prompt_len, 448), r.max_tokens, r.offset_s)

    assert [shape(a) for a in after] == [shape(b) for b in before]
    record = fit.record(plan(fitted, 259))
    assert (record["at_cap"], record["requests"], record["prompt_cap"]) == (len(longer), 40, 448)
    assert record["note"] == (
        "workload chat fitted to the model's 512-token context: prompts at most 448 tokens "
        f"(was 512); {len(longer)} of 40 requests at the cap"
    )


def test_the_output_is_capped_only_when_the_prompt_cannot_make_room():
    spec = dataclasses.replace(load_workload("chat"), output_len=LengthSpec.parse(600))
    fitted, fit = fit_to_context(spec, 512)
    assert (fit.prompt_cap, fit.output_cap) == (1, 511)
    assert fitted.prompt_len.max + fitted.output_len.max == 512
    assert capped(LengthSpec.parse("uniform:16:64"), 10) == LengthSpec("uniform", low=10, high=10)


def test_lengths_given_by_flag_are_never_shortened():
    spec = override(load_workload("chat"), prompt_len=LengthSpec.parse(600))
    assert spec.fit_to_context == ("output_len",)
    assert fit_to_context(spec, 512)[0] is spec  # no cut of the output makes 600 fit: refused
    user = override(spec, output_len=LengthSpec.parse(16))
    assert user.fit_to_context == () and fit_to_context(user, 512)[0] is user


def test_a_file_workload_opts_in_by_name(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("prompt_len: 700\noutput_len: 8\nfit_to_context: prompt_len\n")
    spec = load_workload(str(path))
    assert spec.fit_to_context == ("prompt_len",)
    assert fit_to_context(spec, 512)[0].prompt_len.value == 504
    path.write_text("prompt_len: 700\nfit_to_context: [prompts]\n")
    with pytest.raises(ConfigError, match="fit_to_context names"):
        load_workload(str(path))
    path.write_text("prompt_len: 700\n")
    assert fit_to_context(load_workload(str(path)), 512)[1].changed is False


def _run(cli, tmp_path, name, *args):
    out = tmp_path / name
    result = cli("run", "--kv-cache-mb", "8", "--no-device-sampling", "-q", "--rate", "50",
                 "--out", out, *args)  # fmt: skip
    assert result.returncode == 0, (result.stdout, result.stderr)
    manifest = json.loads((out / "manifest.json").read_text())
    return result, manifest


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "capped_prompt"),
    [
        # each -n holds a request that overflowed: chat's third on seed 7 (512-token
        # prompt), long-prefill-mixed's first on seed 0 (573)
        (["--preset", "tiny", "--seed", "7", "-n", "6"], 448),
        (["--preset", "tiny", "-w", "long-prefill-mixed", "-n", "3"], 416),
        (["--preset", "tiny-moe", "--seed", "7", "-n", "4"], 448),
    ],
)
def test_runs_that_used_to_overflow_tiny_now_run_and_say_so(cli, tmp_path, args, capped_prompt):
    result, manifest = _run(cli, tmp_path, "run", *args)
    assert manifest["status"] == "complete"
    fit = manifest["config"]["workload_fit"]
    assert fit["prompt_cap"] == capped_prompt and fit["at_cap"] >= 1
    assert f"prompts at most {capped_prompt} tokens" in fit["note"]
    assert manifest["config"]["run_options"]["workload"]["prompt_len"]["high"] == capped_prompt
    warning = [line for line in result.stdout.splitlines() if "fitted to the model" in line]
    assert len(warning) == 1 and "512-token context" in warning[0]


def test_a_length_given_by_flag_that_overflows_is_still_refused(cli, tmp_path):
    result = cli("run", "--preset", "tiny", "-n", "2", "--output-len", "600", "-q",
                 "--out", tmp_path / "r")  # fmt: skip
    assert result.returncode == 1 and "model's context is 512" in result.stderr


def test_which_lengths_may_be_fitted_is_no_variable_of_a_comparison():
    # a run from before fit_to_context existed, or with a length given by flag, sends the
    # same requests: the lengths themselves are compared, not the permission
    from perfdiag.analyzers.compare import config_diff
    from perfdiag.traces.manifest import Manifest

    def manifest(workload: dict) -> Manifest:
        config = {"run_options": {"engine": {}, "workload": workload, "probes": {}}}
        return Manifest(1, "x", "r", "2026-01-01T00:00:00Z", "complete", [], config, {}, {})

    spec = load_workload("chat").to_dict()
    old = {k: v for k, v in spec.items() if k != "fit_to_context"}
    assert config_diff(manifest(old), manifest(spec)).variables == ()
    prompt = capped(load_workload("chat").prompt_len, 448)
    shorter = {**spec, "prompt_len": dataclasses.asdict(prompt)}
    names = [c.name for c in config_diff(manifest(spec), manifest(shorter)).variables]
    assert names == ["workload.prompt_len"]
