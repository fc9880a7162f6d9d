"""The keyword arguments a ``**name`` spread passes, when the function builds ``name`` itself.

aider's ``send_completion`` builds ``kwargs = dict(model=..., stream=...)``, adds
``kwargs["messages"] = ...`` (and, for one provider, ``kwargs["extra_headers"] =
{...}`` without a key) and calls ``litellm.completion(**kwargs)`` from a retry
loop. Read as written, that call sends no key: judged like the same keywords
spelled out. Anything the function cannot show (a parameter, a helper's
result, ``kwargs.update(other)``) leaves the spread unread, and the call is
not judged, as before.

One exception, on purpose: ``kwargs.update(self.extra_params)`` merges an
attribute, which is configuration set before the request; it cannot hold a key
made once per request, so it does not stop the reading.
"""

from __future__ import annotations

import ast

from payonce.lint.names import ModuleNames, walk_local

__all__ = ["spread_keywords"]


def spread_keywords(
    function: ast.FunctionDef | ast.AsyncFunctionDef, name: str, names: ModuleNames
) -> list[ast.keyword] | None:
    """The keywords ``**name`` passes, or None when the function does not show them all."""
    arguments = function.args
    parameters = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
    parameters += [argument for argument in (arguments.vararg, arguments.kwarg) if argument]
    if any(argument.arg == name for argument in parameters):
        return None
    found: list[ast.keyword] = []
    built = False
    for node in walk_local(function.body):
        items = _items_added(node, name, names)
        if items is _UNREADABLE:
            return None
        if items is not None:
            found += items
            built = built or _is_construction(node, name)
    return found if built else None


_UNREADABLE: list[ast.keyword] = []  # identity marks "cannot tell", distinct from no items


def _items_added(node: ast.AST, name: str, names: ModuleNames) -> list[ast.keyword] | None:
    """What ``node`` adds to the dict ``name``: None if it does not touch it."""
    if isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for target in targets:
            if isinstance(target, ast.Name) and target.id == name:
                if isinstance(node, ast.AugAssign) or node.value is None:
                    return _UNREADABLE
                return _dict_items(node.value, names)
            if (
                isinstance(target, ast.Subscript)
                and isinstance(target.value, ast.Name)
                and target.value.id == name
                and node.value is not None
            ):
                key = names.string(target.slice)
                return _UNREADABLE if key is None else [ast.keyword(arg=key, value=node.value)]
            if isinstance(target, ast.Tuple | ast.List | ast.Starred) and any(
                isinstance(inner, ast.Name) and inner.id == name for inner in ast.walk(target)
            ):
                return _UNREADABLE
        return None
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == name
    ):
        return _method_items(node, names)
    if isinstance(node, ast.For | ast.AsyncFor | ast.With | ast.AsyncWith | ast.NamedExpr):
        bound = [node.target] if isinstance(node, ast.For | ast.AsyncFor | ast.NamedExpr) else []
        if isinstance(node, ast.With | ast.AsyncWith):
            bound = [item.optional_vars for item in node.items if item.optional_vars]
        if any(
            isinstance(inner, ast.Name) and inner.id == name for b in bound for inner in ast.walk(b)
        ):
            return _UNREADABLE
    return None


def _method_items(call: ast.Call, names: ModuleNames) -> list[ast.keyword] | None:
    assert isinstance(call.func, ast.Attribute)
    method = call.func.attr
    if method == "update":
        items = list(call.keywords)
        if any(keyword.arg is None for keyword in items):
            return _UNREADABLE
        for argument in call.args:
            if isinstance(argument, ast.Attribute):
                continue  # configuration (self.extra_params): not a per-request key
            added = _dict_items(argument, names)
            if added is _UNREADABLE or added is None:
                return _UNREADABLE
            items += added
        return items
    if method == "setdefault" and call.args:
        key = names.string(call.args[0])
        if key is None:
            return _UNREADABLE
        value = call.args[1] if len(call.args) > 1 else ast.Constant(None)
        return [ast.keyword(arg=key, value=value)]
    return None  # get, pop, copy, keys...: reads or removals


def _dict_items(value: ast.expr, names: ModuleNames) -> list[ast.keyword]:
    if isinstance(value, ast.Dict):
        items = []
        for key, item in zip(value.keys, value.values, strict=True):
            text = names.string(key) if key is not None else None
            if text is None:
                return _UNREADABLE
            items.append(ast.keyword(arg=text, value=item))
        return items
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "dict":
        if value.args or any(keyword.arg is None for keyword in value.keywords):
            return _UNREADABLE
        return list(value.keywords)
    return _UNREADABLE


def _is_construction(node: ast.AST, name: str) -> bool:
    return isinstance(node, ast.Assign | ast.AnnAssign) and any(
        isinstance(target, ast.Name) and target.id == name
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
    )
