"""Device ceilings for the roofline: datasheet peaks (hardware.yaml) and the figures
`perfdiag calibrate` measured, stored as JSON per host under a ceilings directory
(`--ceilings-dir`, else $PERFDIAG_CEILINGS_DIR, else ~/.cache/perfdiag/ceilings).

`resolve(device)` prefers a measured entry for that device (this host's first), then the
datasheet entry whose pattern matches the device name, then the generic CPU.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
from dataclasses import asdict, dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path

import yaml

from ..errors import ConfigError

ENV_DIR = "PERFDIAG_CEILINGS_DIR"
MEASURED, DATASHEET = "measured", "datasheet"


@dataclass(frozen=True)
class Ceilings:
    device: str  # the device these figures are for ("cpu" or a GPU's name)
    flops_per_s: dict[str, float]  # per dtype name (float32, bfloat16, …)
    bytes_per_s: float  # memory (or copy) bandwidth
    kind: str  # measured | datasheet
    source: str  # the datasheet's address, or the calibration file
    details: dict = field(default_factory=dict)

    def peak_flops(self, dtype: str) -> float:
        if dtype in self.flops_per_s:
            return self.flops_per_s[dtype]
        if not self.flops_per_s:
            raise ConfigError(f"{self.device}: no FLOP/s ceiling recorded")
        return max(self.flops_per_s.values())

    def to_dict(self) -> dict:
        return asdict(self)


@cache
def datasheets() -> tuple[tuple[re.Pattern, Ceilings], ...]:
    text = resources.files(__package__).joinpath("hardware.yaml").read_text()
    entries = []
    for d in yaml.safe_load(text)["devices"]:
        c = Ceilings(
            device=d["name"],
            flops_per_s={k: float(v) for k, v in d["flops_per_s"].items()},
            bytes_per_s=float(d["bytes_per_s"]),
            kind=DATASHEET,
            source=d["source"],
        )
        entries.append((re.compile(d["match"], re.IGNORECASE), c))
    return tuple(entries)


def datasheet_for(device: str) -> Ceilings | None:
    for pattern, c in datasheets():
        if pattern.search(device):
            return c
    return None


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


def resolve(device: str, directory: Path | None = None, *, measured: bool = True) -> Ceilings:
    """The ceilings a roofline of work on `device` should use."""
    if measured:
        for c in load_measured(directory):
            if c.device == device:
                return c
    found = datasheet_for(device)
    if found is not None:
        return found
    return datasheet_for("cpu")
