"""Every code block of docs/recipes.md is a recipe that a test runs (conftest.recipe)."""

from __future__ import annotations

import re

from tests.recipes.conftest import DOC, ROOT, recipes


def test_every_code_block_of_the_recipes_is_run_by_the_test_it_names() -> None:
    text = DOC.read_text()
    blocks = re.findall(r"^```\w+$", text, re.M)
    found = recipes()
    assert len(found) == len(blocks), "a code block without its <!-- run by ... --> line"
    for name, (test, _code) in found.items():
        source = (ROOT / test).read_text()
        assert f'"{name}"' in source, f"{test} never names the recipe {name}"


def test_the_recipes_are_linked_from_the_readme_and_the_client_docs() -> None:
    assert "docs/recipes.md" in (ROOT / "README.md").read_text()
    assert "(recipes.md)" in (ROOT / "docs" / "client.md").read_text()
