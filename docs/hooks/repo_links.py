"""MkDocs hook: links from a docs page to a file outside docs/ go to the repository.

A page may link to ``../benchmarks/NOTEBOOK.md#a-section`` or
``../tests/lint/labelled/findings.csv``: on GitHub and in an editor that is the
file beside the docs. The site has no such page, so here the link becomes the
file's address in the repository (``repo_url`` of mkdocs.yml, branch ``main``),
and strict builds do not flag it. A link to a file that does not exist in the
checkout is left as it was, so strict mode still reports it.
"""

from __future__ import annotations

import logging
import posixpath
import re
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import Files
from mkdocs.structure.pages import Page

LINK = re.compile(r"(\]\()([^)\s]+)(\))")
# A warning fails `mkdocs build --strict`.
log = logging.getLogger("mkdocs.hooks.repo_links")


def github_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a Markdown file's headings (tests/test_readme.py uses it too)."""
    anchors = set()
    in_code = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        title = line.lstrip("#").strip().lower()
        anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    root = Path(config.config_file_path).resolve().parent
    docs = Path(config.docs_dir).resolve()
    repo = str(config.repo_url or "").rstrip("/")
    if not repo:
        return markdown
    page_dir = (docs / page.file.src_uri).parent

    def rewrite(match: re.Match[str]) -> str:
        target = match.group(2)
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith(("#", "/")):
            return match.group(0)
        path, hash_, anchor = target.partition("#")
        resolved = Path(posixpath.normpath(page_dir / path))
        if resolved.is_relative_to(docs) or not resolved.is_relative_to(root):
            return match.group(0)
        if not resolved.exists():
            return match.group(0)
        if (
            anchor
            and resolved.suffix == ".md"
            and anchor not in github_anchors(resolved.read_text())
        ):
            log.warning(
                "Doc file '%s' links to '%s': no heading #%s there",
                page.file.src_uri,
                target,
                anchor,
            )
        relative = resolved.relative_to(root).as_posix()
        kind = "tree" if resolved.is_dir() else "blob"
        return f"{match.group(1)}{repo}/{kind}/main/{relative}{hash_}{anchor}{match.group(3)}"

    return LINK.sub(rewrite, markdown)
