"""Short names for tables and titles: a kernel's templated C++ name is hundreds of
characters; its readable part is the function and the shape of its brackets."""

from __future__ import annotations


def short_name(name, limit: int = 70) -> str:
    """A kernel's or op's name within `limit`: no `void `, template and argument lists
    elided (`f<…>(…)`), then cut with an ellipsis."""
    name = str(name)
    if len(name) > limit:
        name = elide(name.removeprefix("void "))
    return name if len(name) <= limit else name[: limit - 1] + "…"


def elide(name: str) -> str:
    """`f<float, 4>(int, x)` → `f<…>(…)`: nested brackets dropped, their place kept."""
    out, depth = [], 0
    for ch in name:
        if ch in "<(":
            if depth == 0:
                out.append(ch + "…")
            depth += 1
        elif ch in ">)" and depth:
            depth -= 1
            if depth == 0:
                out.append(ch)
        elif depth == 0:
            out.append(ch)
    return "".join(out)
