"""What a name in a module refers to, and what its literal values are.

Only the module's own text is read: ``import openai as oa`` makes ``oa.OpenAI``
resolve to ``openai.OpenAI``; ``MAX_TRIES = 5`` makes ``range(MAX_TRIES)``
count 5. Nothing is imported or run.
"""

from __future__ import annotations

import ast

__all__ = ["ModuleNames", "dotted", "iter_calls", "walk_local"]

# Some environments ship httpx under another distribution name; the API is the same.
_MODULE_SYNONYMS = {"httpx2": "httpx", "httpcore2": "httpcore"}

_SCOPE_NODES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def dotted(node: ast.expr) -> str | None:
    """``a.b.c`` for a Name/Attribute chain, else None."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def walk_local(nodes: list[ast.stmt] | list[ast.expr] | ast.AST) -> list[ast.AST]:
    """Every node under ``nodes`` without entering nested functions, lambdas or classes."""
    stack: list[ast.AST] = list(nodes) if isinstance(nodes, list) else [nodes]
    found: list[ast.AST] = []
    while stack:
        node = stack.pop()
        found.append(node)
        stack.extend(
            child for child in ast.iter_child_nodes(node) if not isinstance(child, _SCOPE_NODES)
        )
    return found


def iter_calls(nodes: list[ast.stmt] | list[ast.expr] | ast.AST) -> list[ast.Call]:
    """The calls under ``nodes`` (not in nested scopes), in source order."""
    calls = [node for node in walk_local(nodes) if isinstance(node, ast.Call)]
    calls.sort(key=lambda call: (call.lineno, call.col_offset))
    return calls


class ModuleNames:
    """Import aliases and module-level constants of one module."""

    def __init__(self, tree: ast.Module) -> None:
        self.aliases: dict[str, str] = {}
        self.numbers: dict[str, float] = {}
        self.strings: dict[str, str] = {}
        self.imported_roots: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    full = self._canonical(alias.name)
                    self.imported_roots.add(full.split(".")[0])
                    if alias.asname:
                        self.aliases[alias.asname] = full
                    else:
                        root = full.split(".")[0]
                        self.aliases[alias.name.split(".")[0]] = root
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                module = self._canonical(node.module)
                self.imported_roots.add(module.split(".")[0])
                for alias in node.names:
                    if alias.name != "*":
                        self.aliases[alias.asname or alias.name] = f"{module}.{alias.name}"
        for statement in tree.body:
            self._read_constant(statement)

    @staticmethod
    def _canonical(module: str) -> str:
        root, _, rest = module.partition(".")
        root = _MODULE_SYNONYMS.get(root, root)
        return f"{root}.{rest}" if rest else root

    def _read_constant(self, statement: ast.stmt) -> None:
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
            target, value = statement.targets[0], statement.value
        elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
            target, value = statement.target, statement.value
        else:
            return
        if not isinstance(target, ast.Name):
            return
        number = self.number(value)
        if number is not None:
            self.numbers[target.id] = number
        text = self.string(value)
        if text is not None:
            self.strings[target.id] = text

    def qualify(self, node: ast.expr) -> str | None:
        """The fully qualified name of a Name/Attribute chain, through import aliases."""
        name = dotted(node)
        if name is None:
            return None
        head, _, rest = name.partition(".")
        resolved = self.aliases.get(head, head)
        return f"{resolved}.{rest}" if rest else resolved

    def number(self, node: ast.expr | None) -> float | None:
        """A non-negative int/float literal, or a module constant holding one."""
        if isinstance(node, ast.Constant):
            value = node.value
            if isinstance(value, int | float) and not isinstance(value, bool):
                return float(value)
            return None
        if isinstance(node, ast.Name):
            return self.numbers.get(node.id)
        return None

    def integer(self, node: ast.expr | None) -> int | None:
        value = self.number(node)
        return int(value) if value is not None and value == int(value) else None

    def string(self, node: ast.expr | None) -> str | None:
        """The literal text of a string, f-string (``{}`` for holes), ``+`` join or constant."""
        if isinstance(node, ast.Constant):
            return node.value if isinstance(node.value, str) else None
        if isinstance(node, ast.JoinedStr):
            return "".join(self.string(part) or "{}" for part in node.values)
        if isinstance(node, ast.FormattedValue):
            return self.string(node.value)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = self.string(node.left), self.string(node.right)
            if left is None and right is None:
                return None
            return (left or "{}") + (right or "{}")
        if isinstance(node, ast.Name):
            return self.strings.get(node.id)
        return None
