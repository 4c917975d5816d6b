"""Device ceilings for the roofline: datasheet peaks (datasheets.yaml) and the figures
`perfdiag calibrate` measured, stored as JSON per host under a ceilings directory
(`--ceilings-dir`, else $PERFDIAG_CEILINGS_DIR, else ~/.cache/perfdiag/ceilings).

`resolve(device, gpu=…)` prefers a measured entry for that device (this host's first),
then the datasheet entry that fits the device's name (and, where the name does not say,
its recorded memory and SM/CU count: datasheets.yaml says how), then a generic GPU for any
other GPU and the generic CPU for the CPU: a GPU is never judged against a CPU ceiling.
`named(NAME)` is the CLI's `--hardware NAME`: an entry by its name, or any device name
the datasheets recognise.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
from dataclasses import asdict, dataclass, field, replace
from functools import cache
from importlib import resources
from pathlib import Path

import yaml

from ..errors import ConfigError

ENV_DIR = "PERFDIAG_CEILINGS_DIR"
MEASURED, DATASHEET = "measured", "datasheet"
_MEMORY_IN_NAME = re.compile(r"(\d+)\s*G(?:B|iB)?\b", re.IGNORECASE)
_AMD = re.compile(r"\b(AMD|Radeon|Instinct|gfx\d+)", re.IGNORECASE)


@dataclass(frozen=True)
class Ceilings:
    device: str  # the device these figures are for ("cpu" or a GPU's name)
    flops_per_s: dict[str, float]  # per dtype name (float32, bfloat16, …)
    bytes_per_s: float  # memory (or copy) bandwidth
    kind: str  # measured | datasheet
    source: str  # the datasheet's address, or the calibration file
    details: dict = field(default_factory=dict)

    def flops_dtype(self, dtype: str) -> str:
        """The dtype whose figure judges `dtype` work: its own, else float32 (a device
        without bf16 arithmetic, a V100, runs it on its float32 units), else the
        largest recorded."""
        if dtype in self.flops_per_s:
            return dtype
        if not self.flops_per_s:
            raise ConfigError(f"{self.device}: no FLOP/s ceiling recorded")
        if "float32" in self.flops_per_s:
            return "float32"
        return max(self.flops_per_s, key=self.flops_per_s.__getitem__)

    def peak_flops(self, dtype: str) -> float:
        return self.flops_per_s[self.flops_dtype(dtype)]

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Datasheet:
    pattern: re.Pattern
    ceilings: Ceilings
    min_memory_gb: float | None = None
    compute_units: int | None = None
    vendor: str | None = None

    def fits(self, name: str, memory_gb: float | None, units: int | None) -> bool:
        if not self.pattern.search(name):
            return False
        if self.min_memory_gb is not None and (memory_gb is None or memory_gb < self.min_memory_gb):
            return False
        return self.compute_units is None or units is None or units == self.compute_units


@cache
def datasheets() -> tuple[Datasheet, ...]:
    text = resources.files(__package__).joinpath("datasheets.yaml").read_text()
    entries = []
    for d in yaml.safe_load(text)["devices"]:
        c = Ceilings(
            device=d["name"],
            flops_per_s={k: float(v) for k, v in d["flops_per_s"].items()},
            bytes_per_s=float(d["bytes_per_s"]),
            kind=DATASHEET,
            source=d["source"],
        )
        entries.append(
            Datasheet(
                re.compile(d["match"], re.IGNORECASE),
                c,
                d.get("min_memory_gb"),
                d.get("compute_units"),
                d.get("vendor"),
            )
        )
    return tuple(entries)


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if value > 0 else None


def _facts(device: str, gpu: dict | None) -> tuple[float | None, int | None]:
    """The device's memory (GB, 10^9) and SM/CU count: the name's "80GB" first, else
    what the run recorded about the GPU."""
    gpu = gpu if isinstance(gpu, dict) else {}
    m = _MEMORY_IN_NAME.search(device)
    memory = float(m.group(1)) if m else None
    if memory is None and (recorded := _number(gpu.get("memory_bytes"))):
        memory = recorded / 1e9
    units = _number(gpu.get("sm_count"))
    return memory, None if units is None else int(units)


def datasheet_for(device: str, gpu: dict | None = None) -> Ceilings | None:
    """The datasheet entry that fits `device` (a name; `gpu`: what the run recorded
    about it — memory_bytes, sm_count), or None."""
    memory, units = _facts(device, gpu)
    for sheet in datasheets():
        if sheet.fits(device, memory, units):
            return sheet.ceilings
    # A generic name ("AMD Radeon Graphics", as some ROCm versions name an Instinct
    # GCD): its vendor and compute-unit count, where only one entry has that count.
    if units is not None and _AMD.search(device):
        found = [s for s in datasheets() if s.vendor == "amd" and s.compute_units == units]
        if len(found) == 1:
            c = found[0].ceilings
            return replace(
                c, details={**c.details, "matched_by": f"{units} compute units", "reported": device}
            )
    return None


def names() -> list[str]:
    return [s.ceilings.device for s in datasheets()]


def _key(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def named(name: str) -> Ceilings:
    """`--hardware NAME`: the datasheet entry called NAME (case, spaces and punctuation
    aside: "a100-sxm-80gb"), or the one a device of that name would get."""
    want = _key(name)
    for sheet in datasheets():
        entry = _key(sheet.ceilings.device)
        if want and (entry == want or entry.replace("onegcd", "") == want):
            return sheet.ceilings
    if want in ("gpu", "generic", "genericgpu"):
        return datasheet_for("gpu")
    found = datasheet_for(name) if want else None
    if found is None:
        raise ConfigError(
            f"unknown hardware {name!r}; give a device name (e.g. 'NVIDIA A100-SXM4-80GB') "
            f"or one of: {', '.join(names())}"
        )
    return found


def ceilings_dir(explicit: str | os.PathLike | None = None) -> Path:
    if explicit:
        return Path(explicit)
    if os.environ.get(ENV_DIR):
        return Path(os.environ[ENV_DIR])
    return Path.home() / ".cache" / "perfdiag" / "ceilings"


def host_fingerprint() -> str:
    """This machine: host name plus a short hash of its CPU model and core count."""
    from ..traces.environment import cpu_model

    ident = f"{cpu_model()}|{os.cpu_count()}"
    return f"{socket.gethostname()}-{hashlib.blake2b(ident.encode(), digest_size=4).hexdigest()}"


def save_measured(entries: list[Ceilings], directory: Path | None = None) -> Path:
    """Write this host's measured ceilings (replacing its previous file)."""
    d = ceilings_dir(directory)
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{host_fingerprint()}.json"
    tmp = path.with_suffix(".json.tmp")
    payload = {"host": host_fingerprint(), "devices": [e.to_dict() for e in entries]}
    tmp.write_text(json.dumps(payload, indent=2) + "\n")
    os.replace(tmp, path)
    return path


def load_measured(directory: Path | None = None) -> list[Ceilings]:
    """Every measured entry in the directory, this host's file first."""
    d = ceilings_dir(directory)
    try:
        if not d.is_dir():
            return []
    except OSError as e:  # say, a name too long for the filesystem
        raise ConfigError(f"{d}: not a usable directory ({e.strerror})") from None
    mine = f"{host_fingerprint()}.json"
    files = sorted(d.glob("*.json"), key=lambda p: (p.name != mine, p.name))
    out = []
    for p in files:
        try:
            data = json.loads(p.read_text())
            for e in data.get("devices", []):
                out.append(
                    Ceilings(
                        device=str(e["device"]),
                        flops_per_s={k: float(v) for k, v in e["flops_per_s"].items()},
                        bytes_per_s=float(e["bytes_per_s"]),
                        kind=MEASURED,
                        source=str(p),
                        details=dict(e.get("details", {})),
                    )
                )
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            raise ConfigError(f"{p}: not a ceilings file ({err})") from None
    return out


def resolve(
    device: str,
    directory: Path | None = None,
    *,
    measured: bool = True,
    gpu: dict | None = None,
) -> Ceilings:
    """The ceilings a roofline of work on `device` should use (`gpu`: what the run
    recorded about it). A device no entry fits is a generic GPU unless it is the CPU."""
    if measured:
        for c in load_measured(directory):
            if c.device == device:
                return c
    found = datasheet_for(device, gpu)
    if found is not None:
        return found
    if device.strip().lower() == "cpu":
        return datasheet_for("cpu")
    c = datasheet_for("gpu")
    return replace(c, details={**c.details, "reported": device})
