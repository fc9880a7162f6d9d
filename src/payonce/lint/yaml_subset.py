"""A small YAML reader for proxy configurations, keeping line numbers.

It reads the block style that Envoy and LiteLLM configurations are written in:
mappings, sequences (including ``- key: value`` items), plain and quoted
scalars, one-line or multi-line flow collections (``[a, b]``, ``{a: 1}``),
block scalars (``|``, ``>``), comments and ``---`` documents. Anchors and tags
are dropped; aliases stay as text; a comment inside a block scalar is dropped
with the rest of its line (block scalars are never judged). Anything else
raises :class:`YamlError`, which the linter reports as PO902 instead of guessing.

Why not PyYAML: the linter needs the line of every value for its findings,
and only this subset; a parser of ~250 lines costs less than a dependency.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["YamlError", "YamlNode", "parse_documents"]

Scalar = str | int | float | bool | None


class YamlError(ValueError):
    """Text outside the supported subset, with the 1-based line where it was found."""

    def __init__(self, message: str, line: int) -> None:
        super().__init__(f"line {line}: {message}")
        self.line = line


@dataclass(frozen=True, slots=True)
class YamlNode:
    """A value and the line it starts on. Mappings keep their keys as text."""

    value: dict[str, YamlNode] | list[YamlNode] | Scalar
    line: int

    def get(self, key: str) -> YamlNode | None:
        return self.value.get(key) if isinstance(self.value, dict) else None

    def items(self) -> list[YamlNode]:
        return self.value if isinstance(self.value, list) else []


_INT = re.compile(r"^[-+]?(?:0|[1-9][0-9_]*)$")
_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*)?\.[0-9]+(?:[eE][-+]?[0-9]+)?$")
_KEY = re.compile(r"""^(?P<key>"(?:[^"\\]|\\.)*"|'(?:[^']|'')*'|[^\s#'"{\[][^#]*?)\s*:(?:\s+|$)""")


@dataclass(slots=True)
class _Line:
    indent: int
    text: str
    number: int


def parse_documents(text: str) -> list[YamlNode]:
    """Every document in ``text``; an empty document is left out."""
    documents: list[list[_Line]] = [[]]
    for number, raw in enumerate(text.splitlines(), start=1):
        if "\t" in raw[: len(raw) - len(raw.lstrip())]:
            raise YamlError("tab in indentation", number)
        stripped = _strip_comment(raw).rstrip()
        if not stripped.strip():
            continue
        if stripped.startswith("---") or stripped == "...":
            documents.append([])
            rest = stripped[3:].strip() if stripped.startswith("---") else ""
            if rest and not rest.startswith("!"):
                documents[-1].append(_Line(0, rest, number))
            continue
        if stripped.startswith("%"):  # %YAML / %TAG directives
            continue
        body = stripped.lstrip(" ")
        documents[-1].append(_Line(len(stripped) - len(body), body, number))
    return [_Parser(lines).document() for lines in documents if lines]


def _strip_comment(line: str) -> str:
    quote = ""
    for index, char in enumerate(line):
        if quote:
            if char == quote:
                quote = ""
        elif char in "\"'" and (index == 0 or line[index - 1] in " \t[{,:-"):
            quote = char
        elif char == "#" and (index == 0 or line[index - 1] in " \t"):
            return line[:index]
    return line


class _Parser:
    def __init__(self, lines: list[_Line]) -> None:
        self.lines = lines
        self.index = 0

    def document(self) -> YamlNode:
        node = self.block(self.lines[0].indent)
        if self.index < len(self.lines):
            line = self.lines[self.index]
            raise YamlError(f"unexpected indentation before {line.text[:30]!r}", line.number)
        return node

    def _current(self) -> _Line | None:
        return self.lines[self.index] if self.index < len(self.lines) else None

    def block(self, indent: int) -> YamlNode:
        line = self.lines[self.index]
        if _is_item(line.text):
            return self.sequence(line.indent)
        if _KEY.match(line.text):
            return self.mapping(line.indent)
        self.index += 1
        return self.inline(line.text, line)

    def sequence(self, indent: int) -> YamlNode:
        start = self.lines[self.index].number
        items: list[YamlNode] = []
        while (line := self._current()) and line.indent == indent and _is_item(line.text):
            rest = line.text[1:]
            value = rest.strip()
            if not value:
                self.index += 1
                following = self._current()
                if following is not None and following.indent > indent:
                    items.append(self.block(following.indent))
                else:
                    items.append(YamlNode(None, line.number))
                continue
            # "- key: value" opens a mapping whose column is that of "key".
            line.indent = indent + 1 + len(rest) - len(rest.lstrip())
            line.text = value
            items.append(self.block(line.indent))
        return YamlNode(items, start)

    def mapping(self, indent: int) -> YamlNode:
        start = self.lines[self.index].number
        entries: dict[str, YamlNode] = {}
        while (line := self._current()) and line.indent == indent and not _is_item(line.text):
            match = _KEY.match(line.text)
            if match is None:
                raise YamlError(f"expected 'key: value', got {line.text[:30]!r}", line.number)
            key = str(_scalar(match.group("key")))
            rest = line.text[match.end() :].strip()
            self.index += 1
            # A value reports the line of its key: that is where a reader looks.
            value = self.value_after_key(rest, line, indent)
            entries[key] = YamlNode(value.value, line.number)
        following = self._current()
        if following is not None and following.indent > indent:
            raise YamlError("unexpected indentation", following.number)
        return YamlNode(entries, start)

    def value_after_key(self, rest: str, line: _Line, indent: int) -> YamlNode:
        rest = _drop_properties(rest)
        following = self._current()
        if not rest:
            if following is not None and (
                following.indent > indent
                or (following.indent == indent and _is_item(following.text))
            ):
                return self.block(following.indent)
            return YamlNode(None, line.number)
        if rest[0] in "|>":
            parts = []
            while (following := self._current()) and following.indent > indent:
                parts.append(following.text)
                self.index += 1
            return YamlNode("\n".join(parts), line.number)
        if rest[0] in "[{":
            while not _balanced(rest) and (following := self._current()):
                rest += " " + following.text
                self.index += 1
            return self.inline(rest, line)
        # A plain scalar may continue on more-indented lines.
        while (following := self._current()) and following.indent > indent:
            rest += " " + following.text
            self.index += 1
        return self.inline(rest, line)

    def inline(self, text: str, line: _Line) -> YamlNode:
        text = _drop_properties(text)
        if text[:1] in "[{":
            flow = _Flow(text, line.number)
            node = flow.value()
            flow.end()
            return node
        return YamlNode(_scalar(text), line.number)


class _Flow:
    """``[a, {b: c}]`` and ``{a: [1, 2]}`` on one (joined) line."""

    def __init__(self, text: str, line: int) -> None:
        self.text = text
        self.position = 0
        self.line = line

    def _skip(self) -> None:
        while self.position < len(self.text) and self.text[self.position] == " ":
            self.position += 1

    def _peek(self) -> str:
        self._skip()
        return self.text[self.position : self.position + 1]

    def end(self) -> None:
        if self._peek():
            raise YamlError(
                f"text after a flow collection: {self.text[self.position :]!r}", self.line
            )

    def value(self) -> YamlNode:
        char = self._peek()
        if char == "[":
            return self._collection("]", mapping=False)
        if char == "{":
            return self._collection("}", mapping=True)
        return YamlNode(_scalar(self._token()), self.line)

    def _collection(self, close: str, *, mapping: bool) -> YamlNode:
        self.position += 1
        items: list[YamlNode] = []
        entries: dict[str, YamlNode] = {}
        while self._peek() != close:
            if not self._peek():
                raise YamlError(f"unclosed flow collection, expected {close!r}", self.line)
            if mapping:
                key = str(_scalar(self._token(key=True)))
                if self._peek() == ":":
                    self.position += 1
                    entries[key] = self.value()
                else:
                    entries[key] = YamlNode(None, self.line)
            else:
                items.append(self.value())
            if self._peek() == ",":
                self.position += 1
            elif self._peek() != close:
                raise YamlError(f"expected ',' or {close!r} in a flow collection", self.line)
        self.position += 1
        return YamlNode(entries if mapping else items, self.line)

    def _token(self, *, key: bool = False) -> str:
        self._skip()
        start = self.position
        if self.text[start : start + 1] in {'"', "'"}:
            quote = self.text[start]
            self.position += 1
            while self.position < len(self.text):
                if self.text[self.position] == "\\" and quote == '"':
                    self.position += 2
                    continue
                if self.text[self.position] == quote:
                    if quote == "'" and self.text[self.position + 1 : self.position + 2] == "'":
                        self.position += 2
                        continue
                    self.position += 1
                    return self.text[start : self.position]
                self.position += 1
            raise YamlError("unclosed quoted string", self.line)
        stops = ",]}" + (":" if key else "")
        while self.position < len(self.text) and self.text[self.position] not in stops:
            if (
                not key
                and self.text[self.position] == ":"
                and self.text[self.position + 1 : self.position + 2] in {" ", ""}
            ):
                break
            self.position += 1
        return self.text[start : self.position].strip()


def _is_item(text: str) -> bool:
    return text == "-" or text.startswith("- ")


def _balanced(text: str) -> bool:
    depth = 0
    quote = ""
    for char in text:
        if quote:
            quote = "" if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
    return depth <= 0


def _drop_properties(text: str) -> str:
    # "&anchor value", "!!str value", "!Tag value": keep the value.
    while text[:1] in {"&", "!"}:
        _, _, text = text.partition(" ")
        text = text.strip()
    return text


def _scalar(text: str) -> Scalar:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] == '"':
        return (
            text[1:-1]
            .replace('\\"', '"')
            .replace("\\n", "\n")
            .replace("\\t", "\t")
            .replace("\\\\", "\\")
        )
    if len(text) >= 2 and text[0] == text[-1] == "'":
        return text[1:-1].replace("''", "'")
    if text in {"", "~", "null", "Null", "NULL"}:
        return None
    if text in {"true", "True", "TRUE"}:
        return True
    if text in {"false", "False", "FALSE"}:
        return False
    if _INT.match(text):
        return int(text.replace("_", ""))
    if _FLOAT.match(text):
        return float(text.replace("_", ""))
    return text
