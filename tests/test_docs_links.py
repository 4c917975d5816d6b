"""The shipped markdown (README.md, BENCHMARKS.md, docs/*.md) stands on its own: a user's
clone has no ../shared, so nothing links or points there, and every relative link names
a file that exists."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted([ROOT / "README.md", ROOT / "BENCHMARKS.md", *(ROOT / "docs").glob("*.md")])
LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("page", SHIPPED, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_link_leaves_the_repository(page):
    text = page.read_text()
    assert "../shared" not in text
    assert not re.search(r"\b(DOMAIN|DESIGN)\.md\b", text), "names a file users do not have"
    prose = re.sub(r"```.*?```|`[^`\n]*`", "", text, flags=re.S)  # code is not links
    for target in LINK.findall(prose):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue  # a URL or an anchor on the same page
        path = (page.parent / target.split("#")[0]).resolve()
        assert path.exists(), f"{page.name} links to a missing {target}"
        assert ROOT in path.parents or path == ROOT, f"{page.name} links outside: {target}"


def test_the_readme_links_the_guide():
    assert "](docs/guide.md)" in (ROOT / "README.md").read_text()
