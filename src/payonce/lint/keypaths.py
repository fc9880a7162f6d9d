"""Whether a headers variable carries an idempotency key on every path to a call.

The rest of the analyzer is flow-insensitive (the last assignment of a name
wins), which is wrong for keys: ``if use_key: headers["Idempotency-Key"] = k``
before a retry leaves the other path unkeyed, and that path re-bills. So for a
call that sends ``extra_headers=<name>``, this module follows the function's
statements from the top to the call and says on which paths the name holds a
key: every path, none, some (naming the branch condition of the unkeyed one
when a single ``if`` decides it), or cannot tell.

Only what the function itself does to the name is read: assignments of dict
literals (or ``a if c else b`` of them), ``name["Idempotency-Key"] = ...``,
``name.update({...})``, ``name.setdefault(...)`` and ``|=``. A name the
function did not build on some path (a parameter, a global, a call's result)
is "cannot tell", and the caller falls back to the flow-insensitive answer.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from enum import Enum

from payonce.lint.names import ModuleNames
from payonce.lint.sdk import IDEMPOTENCY_HEADERS, has_key_header

__all__ = ["Coverage", "KeyPaths", "headers_coverage", "key_paths"]

_MAX_CONDITION = 60  # longer branch conditions are not quoted in messages
_LOOP_PASSES = 3  # enough for the three-flag lattice to settle
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


class Coverage(Enum):
    """On which paths reaching a call the headers carry a key."""

    EVERY = "every"
    NONE = "none"
    SOME = "some"


@dataclass(frozen=True, slots=True)
class KeyPaths:
    """``coverage`` of the key; for SOME, ``missing`` is the condition of the unkeyed path."""

    coverage: Coverage
    missing: str | None = None


@dataclass(frozen=True, slots=True)
class _State:
    """The headers on the paths reaching one point; no flag set means unreachable."""

    keyed: bool = False
    unkeyed: bool = False
    unknown: bool = False
    missing: str | None = None  # when keyed and unkeyed: the unkeyed paths' condition

    @property
    def reachable(self) -> bool:
        return self.keyed or self.unkeyed or self.unknown

    def verdict(self) -> KeyPaths | None:
        if self.unknown or not self.reachable:
            return None
        if self.keyed and self.unkeyed:
            return KeyPaths(Coverage.SOME, self.missing)
        return KeyPaths(Coverage.EVERY if self.keyed else Coverage.NONE)


_BOTTOM = _State()
_KEYED = _State(keyed=True)
_UNKEYED = _State(unkeyed=True)
_UNKNOWN = _State(unknown=True)


def _join(*states: _State) -> _State:
    live = [state for state in states if state.reachable]
    if not live:
        return _BOTTOM
    if all(state == live[0] for state in live):
        return live[0]
    return _State(
        keyed=any(state.keyed for state in live),
        unkeyed=any(state.unkeyed for state in live),
        unknown=any(state.unknown for state in live),
    )


def _branch(test: ast.expr, when_true: _State, when_false: _State) -> _State:
    """The join after ``if test``, naming the unkeyed side when the test alone decides it."""
    joined = _join(when_true, when_false)
    if joined.unknown or not (joined.keyed and joined.unkeyed):
        return joined
    negated = isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not)
    text = ast.unparse(test.operand if isinstance(test, ast.UnaryOp) and negated else test)
    if len(text) > _MAX_CONDITION:
        return joined
    truth = {True: "true", False: "false"}
    for keyed_side, other, side_true in (
        (when_true, when_false, True),
        (when_false, when_true, False),
    ):
        if keyed_side != _KEYED:
            continue
        # The unkeyed side runs when the test is `not side_true` (flipped for `not x`).
        condition = f"`{text}` is {truth[(not side_true) != negated]}"
        if other == _UNKEYED:
            return _State(keyed=True, unkeyed=True, missing=condition)
        if other.missing is not None:  # an elif chain: both conditions must fail
            return _State(keyed=True, unkeyed=True, missing=f"{condition} and {other.missing}")
    return joined


def headers_coverage(node: ast.expr, names: ModuleNames) -> KeyPaths | None:
    """The coverage of a headers expression on its own: ``{...} if use_key else None``."""
    return _expression(node, names).verdict()


def _expression(node: ast.expr, names: ModuleNames) -> _State:
    if isinstance(node, ast.IfExp):
        return _branch(node.test, _expression(node.body, names), _expression(node.orelse, names))
    if isinstance(node, ast.Constant) and node.value is None:
        return _UNKEYED
    found = has_key_header(node, names)
    if found is None:
        return _UNKNOWN
    return _KEYED if found else _UNKEYED


def key_paths(
    body: list[ast.stmt], name: str, call: ast.Call, names: ModuleNames
) -> KeyPaths | None:
    """The key coverage of ``name`` where ``call`` runs, ``body`` being its function's body."""
    ancestors = _ancestors(body, call)
    if ancestors is None:
        return None
    walker = _Walker(name, ancestors, names)
    walker.block(body, _UNKNOWN)  # before the function assigns it, the name is not ours
    return walker.at_call.verdict()


def _ancestors(body: list[ast.stmt], target: ast.AST) -> set[int] | None:
    """The ids of the nodes that contain ``target``; None when it is not in ``body``.

    Iterative: a long ``"a" + "b" + ...`` chain would exhaust the recursion limit.
    """
    parents: dict[int, ast.AST] = {}
    stack: list[ast.AST] = list(body)
    while stack:
        node = stack.pop()
        if node is target:
            chain: set[int] = set()
            while id(node) in parents:
                node = parents[id(node)]
                chain.add(id(node))
            return chain
        if isinstance(node, _SCOPES):
            continue
        for child in ast.iter_child_nodes(node):
            parents[id(child)] = node
            stack.append(child)
    return None


class _Walker:
    """Runs the statements abstractly, one state per program point, for one name."""

    def __init__(self, name: str, ancestors: set[int], names: ModuleNames) -> None:
        self.name = name
        self.ancestors = ancestors
        self.names = names
        self.at_call = _BOTTOM
        self.loop_exits: list[list[_State]] = []

    def block(self, statements: list[ast.stmt], state: _State) -> _State:
        for statement in statements:
            state = self.statement(statement, state)
        return state

    def _contains_call(self, statements: list[ast.stmt]) -> bool:
        return any(id(statement) in self.ancestors for statement in statements)

    def statement(self, node: ast.stmt, state: _State) -> _State:
        if id(node) in self.ancestors and not self._call_in_a_block(node):
            self.at_call = _join(self.at_call, state)  # the call is in this statement itself
        if isinstance(node, ast.If):
            return _branch(node.test, self.block(node.body, state), self.block(node.orelse, state))
        if isinstance(node, ast.For | ast.AsyncFor | ast.While):
            return self._loop(node, state)
        if isinstance(node, ast.Try | ast.TryStar):
            return self._try(node, state)
        if isinstance(node, ast.With | ast.AsyncWith):
            return self.block(node.body, state)
        if isinstance(node, ast.Match):
            outs = [self.block(case.body, state) for case in node.cases]
            last = node.cases[-1].pattern if node.cases else None
            covered = isinstance(last, ast.MatchAs) and last.pattern is None
            return _join(*outs) if covered else _join(state, *outs)
        if isinstance(node, ast.Return | ast.Raise):
            return _BOTTOM
        if isinstance(node, ast.Continue | ast.Break):
            if self.loop_exits:
                self.loop_exits[-1].append(state)
            return _BOTTOM
        return self._transfer(node, state)

    def _call_in_a_block(self, node: ast.stmt) -> bool:
        blocks: list[list[ast.stmt]] = []
        if isinstance(node, ast.If | ast.For | ast.AsyncFor | ast.While):
            blocks = [node.body, node.orelse]
        elif isinstance(node, ast.Try | ast.TryStar):
            blocks = [node.body, node.orelse, node.finalbody]
            blocks += [handler.body for handler in node.handlers]
        elif isinstance(node, ast.With | ast.AsyncWith):
            blocks = [node.body]
        elif isinstance(node, ast.Match):
            blocks = [case.body for case in node.cases]
        return any(self._contains_call(block) for block in blocks)

    def _loop(self, node: ast.For | ast.AsyncFor | ast.While, state: _State) -> _State:
        # The body may run zero times, and what it does flows back to its top:
        # run it until the state at its top stops changing.
        head = state
        out = state
        exits: list[_State] = []
        for _ in range(_LOOP_PASSES):
            self.loop_exits.append([])
            out = self.block(node.body, head)
            exits = self.loop_exits.pop()
            following = _join(state, out, *exits)
            if following == head:
                break
            head = following
        return _join(self.block(node.orelse, _join(head, out)), *exits)

    def _try(self, node: ast.Try | ast.TryStar, state: _State) -> _State:
        body = self.block(node.body, state)
        # An exception may come before or after anything the body did.
        handler_entry = _join(state, body)
        handlers = [self.block(handler.body, handler_entry) for handler in node.handlers]
        after = _join(self.block(node.orelse, body), *handlers)
        return self.block(node.finalbody, after) if node.finalbody else after

    def _transfer(self, node: ast.stmt, state: _State) -> _State:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                state = self._assign(target, node.value, state)
            return state
        if isinstance(node, ast.AnnAssign) and node.value is not None:
            return self._assign(node.target, node.value, state)
        if isinstance(node, ast.AugAssign) and self._is_name(node.target):
            return self._add_keys(_expression(node.value, self.names), state)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            return self._method(node.value, state)
        if any(
            isinstance(inner, ast.NamedExpr) and self._is_name(inner.target)
            for inner in ast.walk(node)
        ):
            return _UNKNOWN
        return state

    def _is_name(self, node: ast.expr) -> bool:
        return isinstance(node, ast.Name) and node.id == self.name

    def _assign(self, target: ast.expr, value: ast.expr, state: _State) -> _State:
        if self._is_name(target):
            return _expression(value, self.names)
        if isinstance(target, ast.Subscript) and self._is_name(target.value):
            key = self.names.string(target.slice)
            if key is None:
                return _join(state, _UNKNOWN) if state.reachable else state
            return _KEYED if key.lower() in IDEMPOTENCY_HEADERS else state
        if isinstance(target, ast.Tuple | ast.List | ast.Starred) and any(
            self._is_name(inner) for inner in ast.walk(target) if isinstance(inner, ast.expr)
        ):
            return _UNKNOWN
        return state

    def _method(self, call: ast.Call, state: _State) -> _State:
        function = call.func
        if not (isinstance(function, ast.Attribute) and self._is_name(function.value)):
            return state
        if function.attr == "setdefault" and call.args:
            key = self.names.string(call.args[0])
            if key is None:
                return _join(state, _UNKNOWN)
            return _KEYED if key.lower() in IDEMPOTENCY_HEADERS else state
        if function.attr == "update":
            added = [_expression(argument, self.names) for argument in call.args]
            if call.keywords:
                added.append(_expression(ast.Call(ast.Name("dict"), [], call.keywords), self.names))
            return self._add_keys(_join(*added), state)
        return state

    @staticmethod
    def _add_keys(added: _State, state: _State) -> _State:
        """``state`` after merging in headers that carry a key in ``added``'s cases."""
        if not added.reachable or added == _UNKEYED:
            return state
        if added == _KEYED:
            return _KEYED
        return _join(state, _UNKNOWN)
