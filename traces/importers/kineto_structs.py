"""The fields of a Kineto event the importer reads, as msgspec structs.

Both of the importer's front ends hand the same structs to its one row builder
(kineto_events.KinetoFileReader): the fast one decodes a whole batch of events in native
code (kineto_fast.py), the exact one converts each dict the stdlib scanner decoded. Every
field is `Any` (a trace may hold a number where a name belongs; the row builder checks),
and floats stay their text, as the stdlib scanner's `parse_float=str` keeps them.
"""

from __future__ import annotations

from typing import Any

import msgspec

UNSET = msgspec.UNSET  # a key absent from args (a present `null` is None)


class _Fields(msgspec.Struct):
    ph: Any = None
    name: Any = None
    cat: Any = None
    ts: Any = None
    dur: Any = None
    pid: Any = None
    tid: Any = None
    id: Any = None


class RawEvent(_Fields):
    """One event of the fast front end: `args` is its args object's text as written."""

    args: msgspec.Raw = msgspec.Raw()


class Event(_Fields):
    """One event of the exact front end: `args` is the decoded dict (or what stood there)."""

    args: Any = None


class Args(msgspec.Struct):
    """The args keys a span's row reads. Where a key's absence differs from its null
    (`args.get("device", pid)`, `"flops" in args`), the default is UNSET."""

    correlation: Any = None
    device: Any = UNSET
    stream: Any = UNSET
    flops: Any = UNSET
    bytes: Any = UNSET
    rank: Any = None
    dtype: Any = None
    in_msg_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    input_dims: Any = msgspec.field(default=UNSET, name="Input Dims")


NO_ARGS = Args()  # a span whose args are empty or not an object

RAW_EVENTS = msgspec.json.Decoder(list[RawEvent], float_hook=str)
ARGS = msgspec.json.Decoder(list[Args], float_hook=str)
ONE_ARGS = msgspec.json.Decoder(Args, float_hook=str)
ANY = msgspec.json.Decoder(float_hook=str)
DecodeError = (msgspec.DecodeError, msgspec.ValidationError)


def full_args(args) -> dict:
    """An event's whole args as a dict: the exact front end's decoded dict, or the fast
    one's raw text decoded now (only non-span events and shape-costed ops need it)."""
    if args.__class__ is dict:
        return args
    if args.__class__ is msgspec.Raw and len(args):
        value = ANY.decode(args)
        return value if value.__class__ is dict else {}
    return {}


def args_view(args: dict) -> Args:
    """The exact front end's view of a decoded args dict."""
    if not args:
        return NO_ARGS
    try:
        return msgspec.convert(args, Args)
    except UnicodeEncodeError:  # a key with an unpaired surrogate: none of the keys read
        return msgspec.convert({k: v for k, v in args.items() if text_of(k) == k}, Args)


def text_of(value: str) -> str:
    """`value` as valid UTF-8 text: a lone surrogate (JSON's "\\ud800", which Python
    decodes but no UTF-8 file can hold) becomes U+FFFD, so the row is kept, not dropped."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return value
