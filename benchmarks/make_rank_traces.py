"""Many rank files of one (synthetic) job from real Kineto traces, for the Ray import.

    python benchmarks/make_rank_traces.py OUT_DIR [--ranks 64] [--skew-us 50]
        [--source A.json.gz --source B.json.gz ...]

Rank r is a copy of source `r mod len(sources)` (by default the two real ranks of one
job in tests/data/kineto, sampled_rank-0 and sampled_rank-1, taken unchanged from HTA's
test data) written to OUT_DIR/rank-NNN.json.gz, changed in two ways only, as text, so
that every other byte of the real trace stays as recorded:

- `distributedInfo.rank` becomes r and `distributedInfo.world_size` the number of ranks
  (the importer reads a file's rank from there);
- every event's `ts` is shifted by r × skew µs, exactly (decimal arithmetic on the
  number as written: no float rounding), as if rank r's clock ran r × skew µs ahead,
  or the rank entered each step that much later. The sources have no
  `baseTimeNanoseconds` (their `ts` are Unix µs), so `ts` is what carries the shift; a
  source with a time base gets `baseTimeNanoseconds` shifted instead, `ts` unchanged.

pids and tids are not remapped: each rank is its own file and the importer keys every
span by its rank, so two ranks that reuse a pid (as ranks on different hosts do) stay
apart, as they would in a real job's files.
"""

from __future__ import annotations

import argparse
import gzip
import re
import sys
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [
    ROOT / "tests/data/kineto/sampled_rank-0.json.gz",
    ROOT / "tests/data/kineto/sampled_rank-1.json.gz",
]
_TS = re.compile(r'("ts"\s*:\s*)(-?[0-9]+(?:\.[0-9]+)?)')
_BASE = re.compile(r'("baseTimeNanoseconds"\s*:\s*)("?)([0-9]+)("?)')
_DIST = re.compile(r'"distributedInfo"\s*:\s*\{[^{}]*\}')
_FIELD = r'("{key}"\s*:\s*)-?[0-9]+'


def _read(path: Path) -> str:
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return data.decode("utf-8")


def _shift_number(text: str, delta_us: int) -> str:
    """`text` (a JSON number of µs) plus `delta_us`, written with as many decimals."""
    places = len(text.split(".")[1]) if "." in text else 0
    return f"{Decimal(text) + delta_us:.{places}f}"


def _set_field(obj: str, key: str, value: int) -> str:
    pattern = re.compile(_FIELD.format(key=key))
    if pattern.search(obj):
        return pattern.sub(lambda m: f"{m.group(1)}{value}", obj, count=1)
    return obj[:-1].rstrip() + f', "{key}": {value}}}'


def rank_text(source_text: str, rank: int, world_size: int, skew_us: int) -> str:
    """The source trace's text as rank `rank` of `world_size`, shifted rank × skew µs."""
    delta = rank * skew_us
    m = _DIST.search(source_text)
    if m is None:  # no distributedInfo: add one as the document's first key
        head = source_text.index("{") + 1
        info = f'"distributedInfo": {{"rank": {rank}, "world_size": {world_size}}}, '
        text = source_text[:head] + info + source_text[head:]
    else:
        obj = _set_field(_set_field(m.group(0), "rank", rank), "world_size", world_size)
        text = source_text[: m.start()] + obj + source_text[m.end() :]
    if _BASE.search(text):  # ts are relative to the base: shift the base (ns)
        return _BASE.sub(
            lambda b: f"{b.group(1)}{b.group(2)}{int(b.group(3)) + delta * 1000}{b.group(4)}",
            text,
            count=1,
        )
    return _TS.sub(lambda t: t.group(1) + _shift_number(t.group(2), delta), text)


def make_rank_traces(
    out_dir: Path, ranks: int, *, skew_us: int = 50, sources: list[Path] | None = None
) -> list[Path]:
    """Write `ranks` files into `out_dir` (created); returns their paths in rank order."""
    if ranks < 1:
        raise ValueError("ranks must be at least 1")
    texts = [_read(Path(p)) for p in (sources or SOURCES)]
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for r in range(ranks):
        path = out_dir / f"rank-{r:03d}.json.gz"
        text = rank_text(texts[r % len(texts)], r, ranks, skew_us)
        path.write_bytes(gzip.compress(text.encode("utf-8"), compresslevel=6, mtime=0))
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out_dir", type=Path)
    p.add_argument("--ranks", type=int, default=64)
    p.add_argument("--skew-us", type=int, default=50, help="ts shift per rank (µs)")
    p.add_argument("--source", type=Path, action="append", help="a source trace (repeat)")
    a = p.parse_args(argv)
    if a.ranks < 1:
        print("make_rank_traces: --ranks must be at least 1", file=sys.stderr)
        return 1
    for s in a.source or []:
        if not s.is_file():
            print(f"make_rank_traces: {s}: no such file", file=sys.stderr)
            return 1
    paths = make_rank_traces(a.out_dir, a.ranks, skew_us=a.skew_us, sources=a.source)
    print(f"wrote {len(paths)} rank files to {a.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
