"""Upstream URL handling."""

from __future__ import annotations

import pytest

from payonce.errors import ConfigError
from payonce.gateway.upstream import Upstream, parse_upstream_url


@pytest.mark.parametrize(
    ("base", "path", "query", "expected"),
    [
        (
            "https://api.openai.com",
            "/v1/chat/completions",
            "",
            "https://api.openai.com/v1/chat/completions",
        ),
        ("http://h:8000/openai/", "/v1/x", "a=1&b=%20", "http://h:8000/openai/v1/x?a=1&b=%20"),
        ("http://h", "/v1/a%2Fb", "", "http://h/v1/a%2Fb"),
    ],
)
def test_paths_are_joined_without_reencoding(
    base: str, path: str, query: str, expected: str
) -> None:
    assert str(Upstream(base).url_for(path, query)) == expected


@pytest.mark.parametrize(
    "url", ["api.openai.com", "ftp://h", "http://", "http://h/?q=1", "http://h/#f"]
)
def test_bad_upstream_urls(url: str) -> None:
    with pytest.raises(ConfigError, match="--upstream"):
        parse_upstream_url(url)
