"""An nginx configuration reader: directives, their arguments, blocks and lines."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Directive", "NginxError", "parse_nginx"]


class NginxError(ValueError):
    """Unbalanced braces or a directive without its ``;``, with the 1-based line."""

    def __init__(self, message: str, line: int) -> None:
        super().__init__(f"line {line}: {message}")
        self.line = line


@dataclass(frozen=True, slots=True)
class Directive:
    """``name arg...;`` or ``name arg... { children }``."""

    name: str
    args: tuple[str, ...]
    line: int
    children: tuple[Directive, ...] | None = field(default=None)

    def find(self, name: str) -> Directive | None:
        """The last direct child directive called ``name`` (nginx: the last one wins)."""
        found = None
        for child in self.children or ():
            if child.name == name:
                found = child
        return found


def parse_nginx(text: str) -> Directive:
    """The whole file as the children of a ``main`` block."""
    tokens = _tokens(text)
    position = 0

    def block(closing_line: int | None) -> tuple[tuple[Directive, ...], int]:
        nonlocal position
        directives: list[Directive] = []
        words: list[tuple[str, int]] = []
        while position < len(tokens):
            word, line, quoted = tokens[position]
            position += 1
            if word == ";" and not quoted:
                if words:
                    directives.append(_directive(words))
                words = []
            elif word == "{" and not quoted:
                if not words:
                    raise NginxError("block without a directive name", line)
                children, _ = block(line)
                directives.append(_directive(words, children))
                words = []
            elif word == "}" and not quoted:
                if closing_line is None:
                    raise NginxError("unexpected '}'", line)
                if words:
                    raise NginxError(f"directive {words[0][0]!r} has no ';'", words[0][1])
                return tuple(directives), line
            else:
                words.append((word, line))
        if words:
            raise NginxError(f"directive {words[0][0]!r} has no ';'", words[0][1])
        if closing_line is not None:
            raise NginxError("'{' is never closed", closing_line)
        return tuple(directives), 0

    children, _ = block(None)
    return Directive("main", (), 1, children)


def _directive(
    words: list[tuple[str, int]], children: tuple[Directive, ...] | None = None
) -> Directive:
    return Directive(words[0][0], tuple(word for word, _ in words[1:]), words[0][1], children)


def _tokens(text: str) -> list[tuple[str, int, bool]]:
    tokens: list[tuple[str, int, bool]] = []
    line = 1
    index = 0
    length = len(text)
    while index < length:
        char = text[index]
        if char == "\n":
            line += 1
            index += 1
        elif char.isspace():
            index += 1
        elif char == "#":
            while index < length and text[index] != "\n":
                index += 1
        elif char in "{};":
            tokens.append((char, line, False))
            index += 1
        elif char in "\"'":
            end = index + 1
            while end < length and text[end] != char:
                end += 2 if text[end] == "\\" else 1
            value = text[index + 1 : end]
            tokens.append((value, line, True))
            line += value.count("\n")
            index = end + 1
        else:
            end = index
            while end < length and not text[end].isspace() and text[end] not in "{};":
                # ${var} inside a word is part of the word.
                if text[end] == "$" and text[end + 1 : end + 2] == "{":
                    end = text.find("}", end) + 1 or length
                    continue
                end += 1
            tokens.append((text[index:end], line, False))
            index = end
    return tokens
