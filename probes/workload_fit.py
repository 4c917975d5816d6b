"""Fit a workload's lengths to the model's context.

A built-in workload is sized for the `small` preset (2,048 tokens); on `tiny` (512) its long
tails would ask for more than the model holds and the run would be refused. A workload says
which of its lengths may be shortened (`fit_to_context`, every built-in: both): the prompt
is capped first (the output, which sets the decode work, is kept), then the output if the
prompt alone cannot make room. Lengths a user gives (flags, or a file without
`fit_to_context`) are never changed: a run that cannot hold them is refused instead.
The cap comes from the workload's bounds, not the seed's draws, so every request of every
seed fits; lengths below the cap, outputs and send times are the draws they were (the
random token ids after a capped prompt move: they come from one stream)."""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

from .workload import PLAN_CHUNK, LengthSpec, Plan, WorkloadSpec


@dataclass(frozen=True)
class ContextFit:
    """What fitting changed: the caps (None: unchanged) and the context they fit."""

    max_len: int
    prompt_cap: int | None = None
    prompt_was: int | None = None
    output_cap: int | None = None
    output_was: int | None = None

    @property
    def changed(self) -> bool:
        return self.prompt_cap is not None or self.output_cap is not None

    def record(self, planned: Plan) -> dict:
        """For the manifest (`config.workload_fit`): the caps, how many requests (of the
        first PLAN_CHUNK) reached one, and the line the run prints."""
        at_cap = total = 0
        prefix = planned.spec.shared_prefix.length if planned.spec.shared_prefix else 0
        for r in itertools.islice(planned, PLAN_CHUNK):
            total += 1
            suffix = (r.prompt_len or 0) - (prefix if r.prefix_group is not None else 0)
            at_cap += (self.prompt_cap is not None and suffix == self.prompt_cap) or (
                self.output_cap is not None and r.max_tokens == self.output_cap
            )
        parts = []
        if self.prompt_cap is not None:
            parts.append(f"prompts at most {self.prompt_cap} tokens (was {self.prompt_was})")
        if self.output_cap is not None:
            parts.append(f"outputs at most {self.output_cap} tokens (was {self.output_was})")
        note = (
            f"workload {planned.spec.name} fitted to the model's {self.max_len}-token context: "
            f"{', '.join(parts)}; {at_cap} of {total} requests at the cap"
        )
        return {**dataclasses.asdict(self), "at_cap": at_cap, "requests": total, "note": note}


def fit_to_context(spec: WorkloadSpec, max_len: int) -> tuple[WorkloadSpec, ContextFit]:
    """The workload with its elastic lengths capped so that prefix + prompt + output
    <= max_len for every request it can draw; unchanged when it fits already, when it
    replays a file, or when shortening what it may cannot make it fit (the run's own check
    then refuses it as given)."""
    fit = ContextFit(max_len)
    if spec.replay or not spec.fit_to_context:
        return spec, fit
    prefix = spec.shared_prefix.length if spec.shared_prefix else 0
    text = spec.prompts is not None  # a text prompt's length is known only once tokenized
    prompt_max = 0 if text else spec.prompt_len.max
    excess = prefix + prompt_max + spec.output_len.max - max_len
    if excess <= 0:
        return spec, fit
    prompt, output = spec.prompt_len, spec.output_len
    if not text and "prompt_len" in spec.fit_to_context:
        cap = max(1, prompt_max - excess)
        prompt = capped(prompt, cap)
        excess -= prompt_max - cap
        fit = dataclasses.replace(fit, prompt_cap=cap, prompt_was=prompt_max)
    if excess > 0 and "output_len" in spec.fit_to_context:
        cap = max(1, output.max - excess)
        fit = dataclasses.replace(fit, output_cap=cap, output_was=output.max)
        output = capped(output, cap)
        excess -= fit.output_was - cap
    if excess > 0:  # what may not be shortened overflows alone: refused as the user gave it
        return spec, ContextFit(max_len)
    return dataclasses.replace(spec, prompt_len=prompt, output_len=output), fit


def capped(length: LengthSpec, cap: int) -> LengthSpec:
    """The same distribution with no value above `cap`: a fixed length becomes the cap, a
    range's top (and, if it must, its bottom) comes down to it; a lognormal keeps its
    median and spread, its tail clipped at the cap."""
    if length.kind == "fixed":
        return dataclasses.replace(length, value=min(length.value, cap))
    high = min(length.high, cap)
    return dataclasses.replace(length, low=min(length.low, high), high=high)
