"""The hardware-shaped step model beside the additive one (analyzers/step_cost_roofline.py):
chosen by held-out error, and pricing a slice of a prompt as the hardware does, on the
synthetic steps of benchmarks/synthetic_steps.py (whose docstring says what "truth" is)."""

import importlib
import sys
from pathlib import Path

import numpy as np
import pytest

from perfdiag.analyzers.model_flops import ModelShape
from perfdiag.analyzers.step_cost import fit_step_cost
from perfdiag.analyzers.step_cost_roofline import Hardware
from perfdiag.analyzers.steptime import StepTimeline

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
_steps = importlib.import_module("benchmarks.synthetic_steps")
MS, US, DECODES, CONTEXT = _steps.MS, _steps.US, _steps.DECODES, _steps.CONTEXT
gpu_cost, cpu_cost, timeline, true_slice = (
    _steps.gpu_cost,
    _steps.cpu_cost,
    _steps.timeline,
    _steps.true_slice,
)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_gpu_shaped_steps_choose_the_roofline_and_price_a_slice(seed):
    m = fit_step_cost(timeline(gpu_cost, seed))
    assert m.chosen == "roofline" and m.roofline_kind == "hinge", m.priced_by
    assert m.roofline_heldout_error < 0.5 * m.additive_heldout_error
    truth = true_slice(gpu_cost)  # 0.3 ms launch + 8 decodes' 40 µs = 0.62 ms
    assert truth == pytest.approx(0.62 * MS)
    assert m.slice_price_s(512, DECODES, CONTEXT) == pytest.approx(truth, rel=0.2)
    # The additive fit on the same steps prices it several times too high: one line
    # through both roofs charges each step the weights' read again.
    additive = 2 * m.additive_predict_s(512, DECODES, CONTEXT, 1) - m.additive_predict_s(
        1024, DECODES, CONTEXT, 1
    )
    assert additive > 4 * truth
    assert "roofline (hinge)" in m.priced_by


def test_cpu_shaped_steps_keep_the_additive_model():
    m = fit_step_cost(timeline(cpu_cost, 4))
    assert m.chosen == "additive", m.priced_by
    # every step under one roof (no roofline), or the roofline no better
    assert not m.roofline_heldout_error < m.additive_heldout_error
    truth = true_slice(cpu_cost)  # 0.5 + 1.5 ms + 8 × 150 µs + 8 µs of context
    assert m.slice_price_s(512, DECODES, CONTEXT) == pytest.approx(truth, rel=0.2)
    # the property every consumer read before stays the additive fixed + chunk cost
    assert m.slice_cost_s == pytest.approx(2.0 * MS, rel=0.1)


def test_finest_slice_goes_past_the_ridge_on_a_gpu():
    """Below the ridge (5.3 ms / 40 µs ≈ 130 tokens) a slice costs the weights' read
    again, so the finest slice worth its overhead lies well above it; an additive model
    of the same steps would send it elsewhere."""
    m = fit_step_cost(timeline(gpu_cost, 5))
    best = m.finest_slice(0.1)
    # the truth: o + s ≤ 0.1 × (40 µs · c − 5.3 ms) → c ≥ (5.3 + 3) / 0.04 ≈ 208 → 208-224
    assert best is not None and 160 <= best <= 320
    assert m.token_cost_s(64) < 0.5 * 40 * US * 64  # below the ridge tokens are near free


def test_physics_terms_when_the_model_and_device_are_known():
    """With the model and the ceilings the roofline's terms come from model_flops; the
    fit keeps overhead and one efficiency per roof."""
    model = ModelShape(4096, 32, 32, 8, 128, 14336, 128256)  # Llama-3-8B-like, bf16
    hw = Hardware(model, peak_flops_per_s=989e12, bytes_per_s=3.35e12, device="H100",
                  ceilings_kind="datasheet")  # fmt: skip
    from perfdiag.analyzers.step_cost_roofline import features

    def physics_cost(n, b, k, chunks, cached=0):  # the physics at 80 % and 60 % of the roofs
        _, mem, comp = features("physics", hw, n, b, k, chunks, cached)
        return 0.3 * MS + np.maximum(mem[:, 0] / 0.8, comp[:, 0] / 0.6)

    m = fit_step_cost(timeline(physics_cost, 6), hardware=hw)
    assert m.chosen == "roofline" and m.roofline_kind == "physics"
    # the second slice attends to the first's 512 tokens
    truth = (physics_cost(512, DECODES, CONTEXT, 1) + physics_cost(512, DECODES, CONTEXT, 1, 512)
             - physics_cost(1024, DECODES, CONTEXT, 1))  # fmt: skip
    assert m.slice_price_s(512, DECODES, CONTEXT) == pytest.approx(truth[0], rel=0.2)
    assert 1 / m.roofline.compute[0] == pytest.approx(0.6, rel=0.1)


def test_too_few_steps_under_a_roof_fit_no_roofline():
    # every step decode-only and alike: nothing tells two roofs apart
    tl = timeline(lambda n, b, k, c: cpu_cost(0 * n, b, k, 0 * c), 7, steps=40, stalls=False)
    m = fit_step_cost(tl)
    assert m.chosen == "additive"


def test_a_recorded_cpu_run_keeps_the_additive_model(tmp_path):
    """The reference engine on this CPU: a step is overhead and per-token work, no roofs
    to tell apart, so the additive model prices it (and says so)."""
    from perfdiag import load_run
    from perfdiag.analyzers.step_cost_roofline import hardware_of
    from perfdiag.probes.run_options import EngineOptions, ProbeOptions, RunOptions
    from perfdiag.probes.session import record_run
    from perfdiag.probes.workload import ArrivalSpec, LengthSpec, WorkloadSpec

    options = RunOptions(
        EngineOptions(preset="tiny", kv_cache_mb=16.0, chunk_size=512),
        WorkloadSpec(requests=40, warmup=2, seed=21, arrival=ArrivalSpec("closed", 2),
                     prompt_len=LengthSpec.parse("uniform:160:320"),
                     output_len=LengthSpec.parse("uniform:4:12")),
        ProbeOptions(device_sampling=False),
    )  # fmt: skip
    record_run(options, tmp_path / "run", command=["pytest"])
    run = load_run(tmp_path / "run")
    hw = hardware_of(run)
    assert hw is not None and hw.device == "generic CPU"  # the run records its model
    m = fit_step_cost(StepTimeline.from_run(run, 0), hardware=hw)
    assert m.chosen == "additive" and m.priced_by.startswith("the additive step cost model")
    assert m.additive_heldout_error < 0.25
    assert not m.roofline_heldout_error < m.additive_heldout_error
    assert m.slice_cost_s == pytest.approx(m.fixed_s + m.per_prefill_chunk_s)


def test_vllm_budget_slices_priced_from_the_servers_counters():
    """A step of n prompt tokens costs max(D, c·n): with D = 10 ms (ITL p50) and c = 0.1 ms
    a token, a 1000-token prompt cut at 256 pays 3 × 25.6 + 23.2 = 100 ms, as in one step:
    slicing it costs nothing, where the ITL bound says 3 × 10 ms. Below the ridge (the
    prefill no slower than a decode step per slice) the bound is the price."""
    from perfdiag.playbooks.facts_target import _slice_extra_s

    prompts = np.full(20, 1000.0)
    extra, words = _slice_extra_s(prompts, 256, 0.010, 0.100)
    assert extra == pytest.approx(0.0, abs=1e-4) and "roofline" in words
    extra, words = _slice_extra_s(prompts, 256, 0.010, 0.040)
    assert extra == pytest.approx(0.030) and "upper bound" in words
    # at the ridge (c = 0.04 ms: a full slice 10.24 ms, the 232-token rest 9.28 → 10 ms)
    # only the rest's shortfall is paid: 40.72 − 40 ms
    extra, _ = _slice_extra_s(prompts, 256, 0.010, 3 * 0.01024 + 0.010)
    assert extra == pytest.approx(0.00072, rel=0.01)
