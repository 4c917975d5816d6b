"""Datasheet ceilings: every naming variant of the devices traces report, memory and
compute-unit counts where the name does not say, no bf16 on a V100, a generic GPU that
says so, and `--hardware NAME`."""

from pathlib import Path

import pytest

from perfdiag.errors import ConfigError
from perfdiag.hardware.ceilings import datasheet_for, named, resolve

KINETO = Path(__file__).resolve().parent / "data" / "kineto"  # real traces, as in conftest.py
GB = 10**9

# (name as reported, what the run recorded about it or None, the entry it must get)
VARIANTS = [
    ("NVIDIA H100 80GB HBM3", None, "H100 SXM"),
    ("NVIDIA H100 SXM5 80GB", None, "H100 SXM"),
    ("H100 SXM5", None, "H100 SXM"),
    ("NVIDIA H100", None, "H100 SXM"),
    ("NVIDIA H100 PCIe", None, "H100 PCIe"),
    ("NVIDIA H100 80GB HBM2e", None, "H100 PCIe"),
    ("NVIDIA H100 NVL", None, "H100 NVL"),
    ("NVIDIA H200", None, "H200 SXM"),
    ("NVIDIA H200 141GB HBM3e", None, "H200 SXM"),
    ("NVIDIA H200 NVL", None, "H200 NVL"),
    ("NVIDIA GH200 480GB", None, "GH200"),
    ("NVIDIA A100-SXM4-80GB", None, "A100 SXM 80GB"),
    ("NVIDIA A100-SXM-80GB", None, "A100 SXM 80GB"),
    ("NVIDIA A100-SXM4-40GB", None, "A100 SXM 40GB"),
    ("NVIDIA A100-PCIE-40GB", None, "A100 PCIe 40GB"),
    ("NVIDIA A100 80GB PCIe", None, "A100 PCIe 80GB"),
    ("NVIDIA A100-PG509-200", None, "A100 SXM 40GB"),
    ("NVIDIA A100-PG509-200", {"memory_bytes": 42_297_524_224, "sm_count": 108}, "A100 SXM 40GB"),
    ("NVIDIA A100-PG509-210", {"memory_bytes": 85_198_045_184}, "A100 SXM 80GB"),
    ("NVIDIA A100-PCIE", {"memory_bytes": 85_198_045_184}, "A100 PCIe 80GB"),
    ("A100", None, "A100 SXM 40GB"),
    ("Tesla V100-SXM2-16GB", None, "V100 SXM2"),
    ("Tesla V100-SXM2-32GB", None, "V100 SXM2"),
    ("Tesla V100-SXM3-32GB", None, "V100 SXM2"),
    ("Tesla V100-DGXS-32GB", None, "V100 SXM2"),
    ("Tesla V100-PCIE-16GB", None, "V100 PCIe"),
    ("Tesla V100-PCIE-32GB", None, "V100 PCIe"),
    ("Tesla V100-FHHL-16GB", None, "V100 PCIe"),
    ("Tesla V100S-PCIE-32GB", None, "V100S PCIe"),
    ("NVIDIA L4", None, "L4"),
    ("NVIDIA L40S", None, "L40S"),
    ("NVIDIA L40", None, "L40"),
    ("AMD Instinct MI250X", None, "MI250X (one GCD)"),
    ("AMD Instinct MI250X", {"sm_count": 110}, "MI250X (one GCD)"),
    ("AMD Instinct MI250", None, "MI250 (one GCD)"),
    ("AMD Instinct MI250X/MI250", {"sm_count": 104}, "MI250 (one GCD)"),
    ("AMD Instinct MI250X/MI250", {"sm_count": 110}, "MI250X (one GCD)"),
    ("AMD Radeon Graphics", {"memory_bytes": 68_702_699_520, "sm_count": 104}, "MI250 (one GCD)"),
    ("AMD Radeon Graphics", {"sm_count": 110}, "MI250X (one GCD)"),
    ("AMD Instinct MI300X", None, "MI300X"),
    ("AMD Instinct MI300X VF", None, "MI300X"),
    ("MI300X", None, "MI300X"),
    ("AMD Radeon Graphics", {"sm_count": 304}, "MI300X"),
    ("AMD Instinct MI300A", None, "MI300A"),
    ("AMD Instinct MI325X", None, "MI325X"),
]


@pytest.mark.parametrize("name, gpu, entry", VARIANTS)
def test_every_naming_variant_gets_its_datasheet(name, gpu, entry, tmp_path):
    sheet = datasheet_for(name, gpu)
    assert sheet is not None and sheet.device == entry, name
    assert sheet.source.count("http") >= 1
    assert resolve(name, tmp_path, gpu=gpu).device == entry  # no measured figures there


def test_figures_that_tell_the_variants_apart():
    a100_40 = datasheet_for("NVIDIA A100-SXM4-40GB")
    a100_80 = datasheet_for("NVIDIA A100-SXM4-80GB")
    assert (a100_40.bytes_per_s, a100_80.bytes_per_s) == (1.555e12, 2.039e12)
    assert datasheet_for("NVIDIA H100 PCIe").peak_flops("bfloat16") < datasheet_for(
        "NVIDIA H100 80GB HBM3"
    ).peak_flops("bfloat16")
    assert datasheet_for("NVIDIA H200").bytes_per_s == 4.8e12
    mi250x = datasheet_for("AMD Instinct MI250X")  # one GCD: half the package's 383 TFLOP/s
    assert mi250x.peak_flops("bfloat16") == pytest.approx(191.5e12)


def test_a_v100_has_no_bf16_figure():
    for name in ("Tesla V100-SXM2-16GB", "Tesla V100-PCIE-32GB", "Tesla V100S-PCIE-32GB"):
        v100 = datasheet_for(name)
        assert "bfloat16" not in v100.flops_per_s
        assert v100.flops_dtype("bfloat16") == "float32"  # not its fp16 tensor-core figure
        assert v100.peak_flops("bfloat16") == v100.flops_per_s["float32"]
        assert v100.peak_flops("float16") > 1e14


def test_an_unknown_gpu_is_a_generic_gpu_never_the_cpu(tmp_path):
    for name in ("Unknown Accelerator", "NVIDIA GeForce RTX 4090", "AMD Radeon Graphics", "gpu"):
        c = resolve(name, tmp_path)
        assert c.device == "generic GPU", name
        assert "placeholder" in c.source and "--hardware" in c.source
    assert resolve("Unknown Accelerator", tmp_path).details["reported"] == "Unknown Accelerator"
    assert resolve("cpu", tmp_path).device == "generic CPU"
    # a count no entry has, or a generic name that is not AMD's, is not guessed at
    assert resolve("AMD Radeon Graphics", tmp_path, gpu={"sm_count": 96}).device == "generic GPU"


def test_hardware_names():
    assert named("H100 SXM").device == "H100 SXM"
    assert named("a100-sxm-80gb").device == "A100 SXM 80GB"
    assert named("MI250X").device == "MI250X (one GCD)"
    assert named("NVIDIA A100-PG509-200").device == "A100 SXM 40GB"
    assert named("cpu").device == "generic CPU" and named("gpu").device == "generic GPU"
    with pytest.raises(ConfigError, match=r"unknown hardware 'TPU v5'.*H100 SXM"):
        named("TPU v5")


def test_shared_traces_get_their_devices_ceilings(tmp_path, cli):
    import perfdiag
    from perfdiag.analyzers.roofline import roofline_report
    from perfdiag.traces.importers.kineto import import_kineto

    want = {
        "a100_alexnet_cuda_sync": "A100 SXM 40GB",  # "NVIDIA A100-PG509-200"
        "v100_train_ns_resolution": "V100 SXM2",
        "mi250_rocm": "MI250 (one GCD)",  # "AMD Radeon Graphics", 104 CUs
        "sampled_rank-0": "generic GPU",  # kernels, but no deviceProperties
        "cpu_only": "generic CPU",
    }
    for trace, entry in want.items():
        import_kineto([KINETO / f"{trace}.json.gz"], tmp_path / trace)
        run = perfdiag.load_run(tmp_path / trace)
        assert roofline_report(run, ceilings_dir=tmp_path / "none").ceilings.device == entry, trace
    run = perfdiag.load_run(tmp_path / "v100_train_ns_resolution")
    assert roofline_report(run, hardware="H100 SXM").ceilings.device == "H100 SXM"
    r = cli("timeline", tmp_path / "v100_train_ns_resolution", "--hardware", "l4")
    assert r.returncode == 0, r.stderr
    assert "roofline ceilings: L4 (datasheet" in r.stdout.replace("\n", " ")
    r = cli("timeline", tmp_path / "v100_train_ns_resolution", "--hardware", "TPU")
    assert r.returncode == 1 and "unknown hardware 'TPU'" in r.stderr
    assert r.stderr.count("\n") == 1
