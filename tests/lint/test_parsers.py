"""The YAML subset and nginx readers: values, lines, and refusals."""

from __future__ import annotations

import pytest

from payonce.lint.nginx import NginxError, parse_nginx
from payonce.lint.yaml_subset import YamlError, YamlNode, parse_documents


def plain(node: YamlNode) -> object:
    if isinstance(node.value, dict):
        return {key: plain(value) for key, value in node.value.items()}
    if isinstance(node.value, list):
        return [plain(item) for item in node.value]
    return node.value


def test_block_style_with_lines() -> None:
    (doc,) = parse_documents(
        "# comment\n"
        "a: 1\n"
        "b:\n"
        "  - x: 'it''s'\n"
        "    y: [1, 2.5, {z: null}]\n"
        '  -   "q\\"uote"  # trailing comment\n'
        "c: true\n"
        "d: |\n"
        "  text\n"
        "  more\n"
        "e: &anchor plain text\n"
        "f:\n"
        "- same-indent item\n"
    )
    assert plain(doc) == {
        "a": 1,
        "b": [{"x": "it's", "y": [1, 2.5, {"z": None}]}, 'q"uote'],
        "c": True,
        "d": "text\nmore",
        "e": "plain text",
        "f": ["same-indent item"],
    }
    b = doc.get("b")
    assert b is not None and b.line == 3
    first = b.items()[0]
    assert first.line == 4 and (first.get("y") or YamlNode(None, 0)).line == 5


def test_documents_and_multiline_flow() -> None:
    docs = parse_documents("a: 1\n---\nb: {x: 1,\n  y: 2}\n...\n")
    assert [plain(doc) for doc in docs] == [{"a": 1}, {"b": {"x": 1, "y": 2}}]


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("a:\n  b: 1\n c: 2\n", 3),
        ("a: [1, 2\n", 1),
        ("a:\n\tb: 1\n", 2),
        ("a: 1\nnot a mapping line\n", 2),
    ],
)
def test_yaml_refusals_carry_the_line(text: str, line: int) -> None:
    with pytest.raises(YamlError) as caught:
        parse_documents(text)
    assert caught.value.line == line


def test_nginx_blocks_quotes_and_comments() -> None:
    root = parse_nginx(
        "http {\n"
        "  # comment ;\n"
        "  server {\n"
        '    location ~ "^/v1/(chat|x)" {\n'
        "      proxy_pass https://api.openai.com;  # trailing\n"
        "      proxy_next_upstream error timeout;\n"
        "    }\n"
        "  }\n"
        "}\n"
    )
    (http,) = root.children or ()
    (server,) = http.children or ()
    (location,) = server.children or ()
    assert location.args == ("~", "^/v1/(chat|x)") and location.line == 4
    directive = location.find("proxy_next_upstream")
    assert directive is not None and directive.args == ("error", "timeout") and directive.line == 6


@pytest.mark.parametrize(
    ("text", "line"),
    [("server {\n  listen 80;\n", 1), ("}\n", 1), ("server {\n  listen 80\n}\n", 2)],
)
def test_nginx_refusals_carry_the_line(text: str, line: int) -> None:
    with pytest.raises(NginxError) as caught:
        parse_nginx(text)
    assert caught.value.line == line
