"""The sweep's vocabulary: `perfdiag run` flags with their own types, lists, ranges, a
grid, a YAML file, and one-line errors for what cannot be run."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfdiag.errors import ConfigError
from perfdiag.sweeps.spec import Axis, SweepSpec, from_command_line, from_file, parse_values


def test_values_take_the_flags_types_and_ranges():
    assert parse_values("chunk_size", "64,128, 256") == (64, 128, 256)
    assert parse_values("rate", "1:16:x2") == (1.0, 2.0, 4.0, 8.0, 16.0)
    assert parse_values("max_seqs", "8:32:+8") == (8, 16, 24, 32)
    assert parse_values("chunk_size", "128,off") == (128, None)
    assert parse_values("prefix_cache", "on,off") == (True, False)
    assert parse_values("policy", "fcfs,prefix") == ("fcfs", "prefix")
    assert parse_values("max_seqs", "2:5:x1.5") == (2, 3, 4)  # whole numbers still grow


@pytest.mark.parametrize(
    "flag, text, message",
    [
        ("chunk_size", "64,1.5", "not a whole number"),
        ("rate", "fast", "not a number"),
        ("rate", "8:1:x2", "a range is LO:HI"),
        ("rate", "1:8:x1", "a range is LO:HI"),
        ("prefix_cache", "maybe", "not on or off"),
    ],
)
def test_bad_values_are_one_line(flag, text, message):
    with pytest.raises(ConfigError, match=message):
        parse_values(flag, text)


def test_the_grid_is_the_product_of_the_axes_and_names_each_point():
    spec = from_command_line(["preset=tiny", "requests=8"], ["chunk-size=64,off", "rate=1,2"],
                             2, None, None, None)  # fmt: skip
    points = spec.points()
    assert [p.label for p in points] == [
        "chunk-size=64 rate=1", "chunk-size=64 rate=2", "chunk-size=off rate=1",
        "chunk-size=off rate=2",
    ]  # fmt: skip
    assert points[2].run_name(1) == "p002-chunk-size=off-rate=1-r1"
    flags = spec.flags_of(points[2])
    assert flags["no_chunked_prefill"] is True and "chunk_size" not in flags
    assert flags["preset"] == "tiny" and flags["requests"] == 8 and flags["rate"] == 1.0


@pytest.mark.parametrize(
    "sets, varies, message",
    [
        ([], [], "at least one axis"),
        (["rate=2"], ["rate=1,2"], "both set and varied"),
        ([], ["rate=1", "rate=2"], "given twice"),
        ([], ["speed=1,2"], "unknown run flag 'speed'"),
        ([], ["out=a,b"], "unknown run flag"),
        ([], ["target=a"], "set by the sweep itself"),
        (["preset"], ["rate=1"], "use FLAG=VALUE"),
    ],
)
def test_bad_sweeps_are_refused(sets, varies, message):
    with pytest.raises(ConfigError, match=message):
        from_command_line(sets, varies, 1, None, None, None)


def test_a_yaml_file_says_the_same_as_the_command_line(tmp_path: Path):
    f = tmp_path / "sweep.yaml"
    f.write_text(
        "base: {preset: tiny, requests: 8, prefix-cache: false}\n"
        "vary:\n  chunk-size: [32, 'off']\n  rate: '1:4:x2'\n"
        "repeats: 3\nslo: {ttft: 0.5, tpot: 50ms}\n"
    )
    spec = from_file(f)
    assert spec.base == {"preset": "tiny", "requests": 8, "prefix_cache": False}
    assert spec.axes == (Axis("chunk_size", (32, None)), Axis("rate", (1.0, 2.0, 4.0)))
    assert spec.repeats == 3 and spec.slo == "ttft=0.5,tpot=50ms"
    assert len(spec.points()) == 6
    f.write_text("vary: {rate: [1]}\nrepeat: 2\n")
    with pytest.raises(ConfigError, match="unknown key 'repeat'"):
        from_file(f)


def test_engine_knobs_are_refused_against_a_server():
    with pytest.raises(ConfigError, match="chunk-size configures engine_ref"):
        from_command_line([], ["chunk-size=64,128"], 1, None, "http://127.0.0.1:9", None)
    with pytest.raises(ConfigError, match="preset configures engine_ref"):
        from_command_line(["preset=tiny"], ["rate=1,2"], 1, None, "http://127.0.0.1:9", None)
    spec = from_command_line(["requests=8"], ["rate=1,2"], 1, None, "http://127.0.0.1:9", None)
    assert spec.flags_of(spec.points()[0])["target"] == "http://127.0.0.1:9"


def test_repeats_are_bounded():
    with pytest.raises(ConfigError, match="repeats"):
        SweepSpec({}, (Axis("rate", (1.0,)),), repeats=0)
