"""Every relative link of the README and of docs/ names a file that exists, and every
environment variable fastt's Python code names is documented in docs/configuration.md."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOT_VARIABLES = {"FASTT_PRIORITY"}  # the priority executor's registered type name
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_relative_links_resolve() -> None:
    broken = [f"{page.relative_to(ROOT)}: {target}" for page in _pages()
              for target in LINK.findall(page.read_text())
              if not target.startswith(("http://", "https://", "mailto:"))
              and not (page.parent / target).exists()]
    assert not broken, broken


def test_every_setting_documented() -> None:
    read = {name for folder in ("fastt", "tf_patches") for path in (ROOT / folder).rglob("*.py")
            for name in re.findall(r"\"(FASTT_[A-Z_]+)\"", path.read_text())}
    documented = set(re.findall(r"`(FASTT_[A-Z_]+)`", (ROOT / "docs/configuration.md").read_text()))
    assert "FASTT_DEVICES" in read, "the settings' names were not found"
    assert read - NOT_VARIABLES <= documented, sorted(read - NOT_VARIABLES - documented)
