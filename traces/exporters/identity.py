"""The identity an exported Kineto-style trace carries in its header, so that a re-import
knows the job and the machine: `distributedInfo` (rank, world size, backend, process
groups) and `deviceProperties` (the GPUs), as the imported trace had them — not rebuilt
from what the run happens to hold (one rank of a 128-rank job is still of 128)."""

from __future__ import annotations

from ..reader import Run


def device_properties(gpus) -> list[dict]:
    """The run's GPUs in Kineto's `deviceProperties` form (what the plugin and importers
    read): an imported trace's own entries as recorded, a recorded run's from its
    environment (index, name, memory, SMs, compute capability)."""
    out = []
    for g in gpus if isinstance(gpus, list) else []:
        if not isinstance(g, dict):
            continue
        props = g.get("properties")
        if isinstance(props, dict) and props:
            out.append(dict(props))
            continue
        entry = {
            "id": g.get("index"),
            "name": g.get("name"),
            "totalGlobalMem": g.get("memory_bytes"),
            "numSms": g.get("sm_count"),
        }
        major, _, minor = str(g.get("capability") or "").partition(".")
        if major.isdigit() and minor.isdigit():
            entry.update(computeMajor=int(major), computeMinor=int(minor))
        out.append({k: v for k, v in entry.items() if v is not None})
    return out


def _imported_files(run: Run) -> list[dict]:
    kineto = (run.manifest.extra or {}).get("kineto")
    files = kineto.get("files") if isinstance(kineto, dict) else None
    return [f for f in files if isinstance(f, dict)] if isinstance(files, list) else []


def _file_info(meta: dict) -> dict:
    """One imported file's distributedInfo: as recorded (older runs kept only its world
    size and backend), with the rank the import gave the file (--rank can override)."""
    info = meta.get("distributed_info")
    if not isinstance(info, dict):
        info = {k: meta.get(k) for k in ("backend", "world_size") if meta.get(k) is not None}
    rank = meta.get("rank")
    if isinstance(rank, int) and rank >= 0 and info.get("rank") != rank:
        info = {**info, "rank": rank}
    return info


def distributed_info(run: Run, rank: int | None = None) -> dict | None:
    """`distributedInfo` for the file of `rank`, or (None) for one file holding the whole
    run: a single imported file's as it was; several files' common keys without the rank
    (each span keeps its own); None when the run was not imported from Kineto traces."""
    files = _imported_files(run)
    if not files:
        return None
    if rank is not None:
        mine = [f for f in files if f.get("rank") == rank]
        return _file_info(mine[0]) if mine else None
    infos = [_file_info(f) for f in files]
    if len(infos) == 1:
        return infos[0]
    common = {k: v for k, v in infos[0].items() if all(i.get(k) == v for i in infos[1:])}
    common.pop("rank", None)
    return common or None


def kineto_header(run: Run, rank: int | None = None) -> dict:
    """The header keys an export writes before its events (the importer reads them there)."""
    header: dict = {}
    props = device_properties(run.manifest.environment.get("gpus"))
    if props:
        header["deviceProperties"] = props
    info = distributed_info(run, rank)
    if info:
        header["distributedInfo"] = info
    return header
