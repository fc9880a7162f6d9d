"""The Python rules (PO1xx-PO4xx) over one module's syntax tree.

Two passes. The first records which names hold which LLM clients (by scope:
a function's locals, a class's ``self.`` attributes, the module), what each
local name was last assigned, and where functions are defined. The second
walks the code with the stack of retry layers in force, records every LLM
call and every call from one local function to another, and checks timeouts
and timeout handlers. Retry layers then flow along local calls (a helper
called from a retry loop is retried too) before the call sites are judged.

Everything is per file and flow-insensitive (the last assignment of a name
wins), except whether headers carry a key on every path to a call
(:mod:`payonce.lint.keypaths`). A parameter annotated with an SDK client type
is that client with the SDK's defaults. The linter prefers saying nothing to
guessing (``KeyState.UNKNOWN``).
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from dataclasses import dataclass, replace

from payonce.lint.agents_sdk import runner_retry_message
from payonce.lint.calls import LlmCall, recognise
from payonce.lint.findings import Finding
from payonce.lint.keypaths import KeyPaths, key_paths
from payonce.lint.names import ModuleNames, dotted, iter_calls, walk_local
from payonce.lint.recursion import RECURSION_KIND, recursion_layer
from payonce.lint.retries import (
    RetryLayer,
    decorator_layers,
    handler_goes_round,
    loop_layer,
    retry_wrapper_layer,
)
from payonce.lint.sdk import (
    SDK_DEFAULT_RETRIES,
    ClientInfo,
    ClientKind,
    client_from_annotation,
    client_from_call,
    derive_client,
    is_deriving_call,
    protected_client,
)
from payonce.lint.spread import spread_keywords
from payonce.lint.stacks import worst_stack
from payonce.lint.timeouts import check_timeout
from payonce.lint.verdicts import judge_call

__all__ = ["analyze_module"]

_Scope = ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
_INSTRUMENT_WRAPPERS = frozenset(
    {"instructor.from_openai", "instructor.from_anthropic", "instructor.patch", "instructor.apatch"}
)
_FRESH_CALLS = re.compile(
    r"^(uuid\.uuid[1-8]|secrets\.token_\w+|os\.urandom|random\.\w+|time\.time(_ns)?"
    r"|datetime\.datetime\.now|datetime\.datetime\.utcnow|ulid\.\w+|nanoid\.\w+)$"
)
_STATUS_CHECK = re.compile(r"status|retrieve|lookup|poll", re.IGNORECASE)
_TIMEOUT_EXCEPTIONS = frozenset({"APITimeoutError", "ReadTimeout", "TimeoutException"})
_TIMEOUT_MODULES = frozenset({"openai", "anthropic", "httpx", "requests", "litellm", "aiohttp"})
_MAX_STACKS = 16
_CLIENT_ROOTS = frozenset(
    {
        "openai",
        "anthropic",
        "langchain",
        "langchain_openai",
        "langchain_anthropic",
        "langchain_community",
        "litellm",
    }
)


@dataclass(frozen=True, slots=True)
class _Site:
    call: LlmCall
    function: int
    layers: tuple[RetryLayer, ...]
    fresh_key: bool  # the key is minted where a local retry layer re-runs it
    fresh_key_in_function: bool  # ...or anywhere in the function (for callers' layers)


@dataclass(frozen=True, slots=True)
class _Edge:
    caller: int
    callee: int
    layers: tuple[RetryLayer, ...]


def analyze_module(tree: ast.Module, path: str) -> list[Finding]:
    """Every PO1xx-PO4xx finding in one parsed module."""
    return _Analyzer(tree, path).run()


class _Analyzer:
    def __init__(self, tree: ast.Module, path: str) -> None:
        self.tree = tree
        self.path = path
        self.names = ModuleNames(tree)
        self.clients: dict[tuple[int, str], ClientInfo] = {}
        self.values: dict[tuple[int, str], ast.expr] = {}
        self.subscript_keys: dict[tuple[int, str], set[str]] = defaultdict(set)
        self.functions: dict[tuple[int, str], int] = {}
        self.function_nodes: dict[int, ast.FunctionDef | ast.AsyncFunctionDef] = {}
        self.resolving: set[int] = set()
        self.stack: list[_Scope] = []
        self.layers: tuple[RetryLayer, ...] = ()
        self.fresh_names: dict[tuple[int, str], frozenset[int]] = {}
        self.sites: list[_Site] = []
        self.edges: list[_Edge] = []
        self.callers: dict[int, list[_Edge]] = {}
        self.key_paths_seen: dict[tuple[int, str], KeyPaths | None] = {}
        # The openai module's own client, configured by openai.max_retries = N.
        self.module_client = ClientInfo(
            ClientKind.OPENAI, "openai (module)", 0, SDK_DEFAULT_RETRIES, False
        )
        self.findings: list[Finding] = []

    def run(self) -> list[Finding]:
        self._bind(self.tree)
        self._walk(self.tree)
        self._judge_sites()
        return self.findings

    # -- scopes -----------------------------------------------------------------

    def _function_scope(self) -> _Scope:
        for scope in reversed(self.stack):
            if not isinstance(scope, ast.ClassDef):
                return scope
        return self.stack[0]

    def _class_scope(self) -> ast.ClassDef | None:
        for scope in reversed(self.stack):
            if isinstance(scope, ast.ClassDef):
                return scope
        return None

    def _target_key(self, target: ast.expr) -> tuple[int, str] | None:
        name = dotted(target)
        if name is None:
            return None
        head = name.split(".")[0]
        owner = self._class_scope()
        if head in {"self", "cls"} and owner is not None:
            attribute = name.split(".", 1)[1] if "." in name else ""
            return id(owner), f"self.{attribute}" if attribute else name
        if isinstance(self.stack[-1], ast.ClassDef) and isinstance(target, ast.Name):
            return id(self.stack[-1]), "self." + name  # class attribute, read as self.<name>
        return id(self._function_scope()), name

    def _lookup(
        self, table: dict[tuple[int, str], ClientInfo], node: ast.expr
    ) -> ClientInfo | None:
        name = dotted(node)
        if name is None:
            return None
        head = name.split(".")[0]
        owner = self._class_scope()
        if head in {"self", "cls"} and owner is not None and "." in name:
            return table.get((id(owner), "self." + name.split(".", 1)[1]))
        innermost = self.stack[-1]
        for scope in reversed(self.stack):
            if isinstance(scope, ast.ClassDef) and scope is not innermost:
                continue  # class bodies are not enclosing scopes for their methods
            found = table.get((id(scope), name))
            if found is not None:
                return found
            if head in _parameters(scope) or (id(scope), head) in self.values:
                return None  # a parameter or a local shadows the outer names
        return None

    def _client_of(self, node: ast.expr) -> ClientInfo | None:
        if isinstance(node, ast.Call):
            built = client_from_call(node, self.names, dotted(node.func) or "client")
            if built is not None:
                return built
            qualified = self.names.qualify(node.func) or ""
            if qualified in _INSTRUMENT_WRAPPERS and node.args:
                return self._client_of(node.args[0])
            if qualified.startswith("payonce.client") and qualified.endswith(".protect"):
                base = self._client_of(node.args[0]) if node.args else None
                return protected_client(base, node, self.names) if base is not None else None
            if is_deriving_call(node):
                assert isinstance(node.func, ast.Attribute)
                base = self._client_of(node.func.value)
                return derive_client(base, node, self.names) if base is not None else None
            return self._returned_client(node)
        if isinstance(node, ast.Await):
            return self._client_of(node.value)
        if isinstance(node, ast.BoolOp | ast.IfExp):
            # client or OpenAI(...), OpenAI(...) if x else AsyncOpenAI(...): the one we can
            # see constructed, before one only a parameter's annotation describes.
            options = node.values if isinstance(node, ast.BoolOp) else [node.body, node.orelse]
            seen = [client for option in options if (client := self._client_of(option))]
            constructed = [client for client in seen if client.origin is None]
            return (constructed or seen)[0] if seen else None
        if self.names.qualify(node) == "openai":
            return self.module_client  # openai.chat.completions.create(...)
        return self._lookup(self.clients, node)

    def _returned_client(self, call: ast.Call) -> ClientInfo | None:
        """The client a local function or method returns: ``client = self._get_client()``."""
        callee = self._local_function(call.func)
        function = self.function_nodes.get(callee) if callee is not None else None
        if function is None or id(function) in self.resolving:
            return None
        self.resolving.add(id(function))
        try:
            for node in walk_local(function.body):
                if isinstance(node, ast.Return) and node.value is not None:
                    found = self._client_of(node.value)
                    if found is not None:
                        return found
        finally:
            self.resolving.discard(id(function))
        return None

    def _value_of(self, name: str) -> tuple[ast.expr | None, frozenset[str]]:
        scope = id(self._function_scope())
        return self.values.get((scope, name)), frozenset(self.subscript_keys.get((scope, name), ()))

    # -- pass 1: bindings ---------------------------------------------------------

    def _bind(self, node: ast.AST) -> None:
        scoped = isinstance(node, _Scope)
        if scoped:
            assert isinstance(node, _Scope)
            self.stack.append(node)
            if isinstance(node, _FUNCTIONS) and self.names.imported_roots & _CLIENT_ROOTS:
                self._bind_parameters(node)
        for child in ast.iter_child_nodes(node):
            if isinstance(child, _FUNCTIONS):
                self._record_function(child)
            elif isinstance(child, ast.Assign | ast.AnnAssign | ast.NamedExpr):
                self._bind_assignment(child)
            elif isinstance(child, ast.With | ast.AsyncWith):
                for item in child.items:
                    if item.optional_vars is not None:
                        self._bind_value(item.optional_vars, item.context_expr)
            self._bind(child)
        if scoped:
            self.stack.pop()

    def _record_function(self, function: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.function_nodes[id(function)] = function
        if isinstance(self.stack[-1], ast.ClassDef):
            self.functions[(id(self.stack[-1]), "self." + function.name)] = id(function)
        else:
            self.functions[(id(self.stack[-1]), function.name)] = id(function)

    def _bind_parameters(self, function: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        # `client: openai.AsyncOpenAI`: built elsewhere, with the SDK's defaults.
        arguments = function.args
        for argument in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]:
            client = client_from_annotation(argument, self.names)
            if client is not None:
                self.clients[(id(function), argument.arg)] = client

    def _bind_assignment(self, node: ast.Assign | ast.AnnAssign | ast.NamedExpr) -> None:
        if node.value is None:
            return
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for target in targets:
            if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name):
                key = self.names.string(target.slice)
                if key is not None:
                    self.subscript_keys[(id(self._function_scope()), target.value.id)].add(key)
            elif isinstance(target, ast.Attribute):
                self._bind_attribute(target, node.value)
            self._bind_value(target, node.value)

    def _bind_attribute(self, target: ast.Attribute, value: ast.expr) -> None:
        # client._idempotency_header = "Idempotency-Key" / client.max_retries = 0
        if target.attr not in {"_idempotency_header", "max_retries"}:
            return
        if target.attr == "max_retries" and self.names.qualify(target.value) == "openai":
            retries = self.names.integer(value)
            self.module_client = replace(
                self.module_client, max_retries=retries, retries_given=True
            )
            return
        owner = target.value
        wrapped = _wrapped_sdk_client(owner)
        if wrapped is not None and target.attr == "_idempotency_header":
            # llm.root_client._idempotency_header = ...: the SDK client a LangChain
            # wrapper calls, so the wrapper's calls send the key.
            base = self._client_of(wrapped)
            if base is not None and base.kind is ClientKind.LANGCHAIN:
                owner = wrapped
        client = self._client_of(owner)
        key = self._target_key(owner)
        if client is None or key is None:
            return
        if target.attr == "_idempotency_header":
            sends = not (isinstance(value, ast.Constant) and value.value is None)
            if client.kind is ClientKind.LANGCHAIN and owner is target.value:
                # The wrapper has no such attribute of its own: nothing reads it.
                self.clients[key] = replace(client, wrapper_header_line=target.lineno)
                return
            self.clients[key] = replace(
                client, sends_sdk_key=sends, header_attribute=sends, lost_key_line=None
            )
        else:
            retries = self.names.integer(value)
            self.clients[key] = replace(client, max_retries=retries, retries_given=True)

    def _bind_value(self, target: ast.expr, value: ast.expr) -> None:
        key = self._target_key(target)
        if key is None:
            return
        if isinstance(target, ast.Name):
            self.values[key] = value
        client = self._client_of(value)
        if client is not None:
            self.clients[key] = replace(client, name=dotted(target) or client.name)

    # -- pass 2: the walk ---------------------------------------------------------

    def _walk(self, node: ast.AST) -> None:
        if isinstance(node, _FUNCTIONS):
            self._walk_function(node)
        elif isinstance(node, ast.ClassDef | ast.Lambda | ast.Module):
            self._walk_scope(node, ())
        elif isinstance(node, ast.For | ast.AsyncFor | ast.While):
            self._walk_loop(node)
        elif isinstance(node, ast.Try | ast.TryStar):
            self._check_timeout_handlers(node)
            self._walk_children(node)
        elif isinstance(node, ast.Call):
            self._visit_call(node)
            self._walk_children(node)
        else:
            if isinstance(node, ast.Assign | ast.AnnAssign | ast.NamedExpr):
                self._note_fresh_assignment(node)
            self._walk_children(node)

    def _walk_children(self, node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            self._walk(child)

    def _walk_scope(self, node: _Scope, layers: tuple[RetryLayer, ...]) -> None:
        saved = self.layers
        self.layers = layers
        self.stack.append(node)
        self._walk_children(node)
        self.stack.pop()
        self.layers = saved

    def _walk_function(self, function: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for decorator in function.decorator_list:
            self._walk(decorator)
        saved = self.layers
        self.layers = tuple(decorator_layers(function, self.names))
        self.stack.append(function)
        recursion = recursion_layer(function, self._local_function, self.function_nodes)
        if recursion is not None:
            self.layers = (*self.layers, recursion)
        for statement in function.body:
            self._walk(statement)
        self.stack.pop()
        self.layers = saved

    def _walk_loop(self, loop: ast.For | ast.AsyncFor | ast.While) -> None:
        layer = loop_layer(loop, self.names)
        self._walk(loop.iter if isinstance(loop, ast.For | ast.AsyncFor) else loop.test)
        saved = self.layers
        if layer is not None:
            self.layers = (*saved, layer)
        for statement in loop.body:
            self._walk(statement)
        self.layers = saved
        for statement in loop.orelse:
            self._walk(statement)

    def _note_fresh_assignment(self, node: ast.Assign | ast.AnnAssign | ast.NamedExpr) -> None:
        if node.value is None or not self._is_fresh(node.value):
            return
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        regions = frozenset(layer.region for layer in self.layers)
        for target in targets:
            if isinstance(target, ast.Name):
                self.fresh_names[(id(self._function_scope()), target.id)] = regions

    def _is_fresh(self, node: ast.expr) -> bool:
        return any(
            _FRESH_CALLS.match(self.names.qualify(call.func) or "") for call in iter_calls(node)
        )

    def _visit_call(self, call: ast.Call) -> None:
        wrapper = retry_wrapper_layer(call, self.names)
        for argument in [*call.args, *(keyword.value for keyword in call.keywords)]:
            callee = self._local_function(argument)
            if callee is not None:
                layers = (*self.layers, wrapper) if wrapper is not None else self.layers
                self.edges.append(_Edge(id(self._function_scope()), callee, layers))
        callee = self._local_function(call.func)
        if callee is not None:
            self.edges.append(_Edge(id(self._function_scope()), callee, self.layers))
        client = client_from_call(call, self.names, dotted(call.func) or "client")
        if client is not None:
            self._check_client_timeout(call, client)
        if self.names.qualify(call.func) == "asyncio.wait_for":
            self._check_wait_for(call)
        runner_retry = runner_retry_message(call, self.names)
        if runner_retry is not None:
            self._add(call, "PO201", runner_retry)
        llm = self._recognise(call)
        if llm is not None:
            self._record_site(llm)

    def _local_function(self, node: ast.expr) -> int | None:
        name = dotted(node)
        if name is None:
            return None
        owner = self._class_scope()
        if name.startswith(("self.", "cls.")) and owner is not None:
            return self.functions.get((id(owner), "self." + name.split(".", 1)[1]))
        innermost = self.stack[-1]
        for scope in reversed(self.stack):
            if isinstance(scope, ast.ClassDef) and scope is not innermost:
                continue
            found = self.functions.get((id(scope), name))
            if found is not None:
                return found
        return None

    def _recognise(self, call: ast.Call) -> LlmCall | None:
        return recognise(
            call, self.names, self._client_of, self._value_of, self._key_paths, self._spread
        )

    def _spread(self, call: ast.Call, name: str) -> list[ast.keyword] | None:
        """The keywords ``**name`` passes to ``call``, when this function builds ``name``."""
        scope = self._function_scope()
        if not isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef):
            return None
        return spread_keywords(scope, name, self.names)

    def _key_paths(self, call: ast.Call, name: str) -> KeyPaths | None:
        """On which paths to ``call`` the headers variable ``name`` holds a key."""
        seen = (id(call), name)
        if seen not in self.key_paths_seen:
            scope = self._function_scope()
            found = None
            if isinstance(scope, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef):
                found = key_paths(scope.body, name, call, self.names)
            self.key_paths_seen[seen] = found
        return self.key_paths_seen[seen]

    def _record_site(self, llm: LlmCall) -> None:
        fresh_here = fresh_anywhere = False
        key = llm.key_expr
        if key is not None:
            if self._is_fresh(key):
                fresh_here = fresh_anywhere = True
            elif isinstance(key, ast.Name):
                regions = self.fresh_names.get((id(self._function_scope()), key.id))
                if regions is not None:
                    fresh_anywhere = True
                    fresh_here = bool(regions & {layer.region for layer in self.layers})
        if llm.timeout is not None:
            self._timeout_finding(llm.node, llm.timeout, llm.what)
        self.sites.append(
            _Site(llm, id(self._function_scope()), self.layers, fresh_here, fresh_anywhere)
        )

    # -- timeouts (PO301, PO302) ------------------------------------------------

    def _check_client_timeout(self, call: ast.Call, client: ClientInfo) -> None:
        for keyword in call.keywords:
            if keyword.arg in {"timeout", "request_timeout", "default_request_timeout"}:
                what = self.names.qualify(call.func) or client.kind.value
                self._timeout_finding(keyword.value, keyword.value, f"{what}(...)")

    def _check_wait_for(self, call: ast.Call) -> None:
        awaited = call.args[0] if call.args else None
        if not isinstance(awaited, ast.Call) or self._recognise(awaited) is None:
            return
        limit = call.args[1] if len(call.args) > 1 else None
        for keyword in call.keywords:
            if keyword.arg == "timeout":
                limit = keyword.value
        problem = check_timeout(limit, self.names, "asyncio.wait_for") if limit else None
        if problem is not None and problem.code == "PO301":
            self._add(call, problem.code, problem.message)

    def _timeout_finding(self, where: ast.AST, value: ast.expr, what: str) -> None:
        problem = check_timeout(value, self.names, what)
        if problem is not None:
            self._add(where, problem.code, problem.message)

    # -- timeout handlers (PO401) -----------------------------------------------

    def _check_timeout_handlers(self, node: ast.Try | ast.TryStar) -> None:
        sent = [llm for call in iter_calls(node.body) if (llm := self._recognise(call))]
        unkeyed = [llm for llm in sent if llm.unkeyed]
        if not unkeyed:
            return
        for handler in node.handlers:
            caught = self._caught_timeout(handler.type)
            if caught is None or self._checks_status(handler):
                continue
            how = self._how_it_resends(handler)
            if how is not None:
                line, gap = unkeyed[0].node.lineno, unkeyed[0].key_gap
                missing = (
                    f"without an idempotency key{gap} and without a status check"
                    if gap
                    else "without an idempotency key or a status check"
                )
                self._add(
                    handler,
                    "PO401",
                    f"except {caught} {how}, {missing}:"
                    f" the call on line {line} has usually finished and been billed when the"
                    " client times out; send a key generated once per request, or check the"
                    " request's status before re-sending",
                )

    def _caught_timeout(self, node: ast.expr | None) -> str | None:
        if node is None:
            return None
        candidates = node.elts if isinstance(node, ast.Tuple) else [node]
        for candidate in candidates:
            qualified = self.names.qualify(candidate) or ""
            last = qualified.rsplit(".", 1)[-1]
            root = qualified.split(".")[0]
            if (
                last in _TIMEOUT_EXCEPTIONS
                or last == "TimeoutError"
                or (last == "Timeout" and root in _TIMEOUT_MODULES)
                or qualified == "socket.timeout"
            ):
                return dotted(candidate) or last
        return None

    def _checks_status(self, handler: ast.ExceptHandler) -> bool:
        for node in walk_local(handler.body):
            if isinstance(node, ast.Call):
                name = dotted(node.func) or ""
                if _STATUS_CHECK.search(name.rsplit(".", 1)[-1]):
                    return True
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and "/_payonce/requests" in node.value
            ):
                return True
        return False

    def _how_it_resends(self, handler: ast.ExceptHandler) -> str | None:
        for call in iter_calls(handler.body):
            if self._recognise(call) is not None:
                return f"re-sends the call on line {call.lineno}"
            if isinstance(call.func, ast.Attribute) and call.func.attr == "retry":
                return "re-queues the task with .retry()"
        loops = [layer for layer in self.layers if "loop" in layer.kind or "while" in layer.kind]
        if loops and handler_goes_round(handler):
            return f"goes round the {loops[-1].kind} on line {loops[-1].line}"
        function_layers = [
            layer
            for layer in self.layers
            if layer.region == id(self.stack[-1]) and layer.kind != RECURSION_KIND
        ]
        if function_layers and handler.body and isinstance(handler.body[-1], ast.Raise):
            layer = function_layers[0]
            return f"re-raises into {layer.kind} on line {layer.line}"
        return None

    # -- judging call sites (PO101, PO102, PO201, PO202, PO203) -------------------

    def _incoming(self, function: int, visiting: frozenset[int]) -> list[tuple[RetryLayer, ...]]:
        edges = self.callers.get(function, [])
        if not edges or function in visiting:
            return [()]
        stacks: list[tuple[RetryLayer, ...]] = []
        for edge in edges:
            for outer in self._incoming(edge.caller, visiting | {function}):
                stacks.append((*outer, *edge.layers))
        stacks.sort(key=lambda stack: -len(stack))
        return stacks[:_MAX_STACKS]

    def _judge_sites(self) -> None:
        for edge in self.edges:
            self.callers.setdefault(edge.callee, []).append(edge)
        incoming_cache: dict[int, list[tuple[RetryLayer, ...]]] = {}
        for site in self.sites:
            if site.function not in incoming_cache:
                incoming_cache[site.function] = self._incoming(site.function, frozenset())
            stacks = [_once((*outer, *site.layers)) for outer in incoming_cache[site.function]]
            callers_retry = any(incoming_cache[site.function])
            fresh = site.fresh_key or (site.fresh_key_in_function and callers_retry)
            for code, message in judge_call(site.call, worst_stack(stacks), fresh_key=fresh):
                self._add(site.call.node, code, message)

    def _add(self, node: ast.AST, code: str, message: str) -> None:
        line = getattr(node, "lineno", 1)
        column = getattr(node, "col_offset", 0) + 1
        end_line = getattr(node, "end_lineno", None) or line
        end_column = (getattr(node, "end_col_offset", None) or column - 1) + 1
        self.findings.append(Finding(self.path, line, column, code, message, end_line, end_column))


def _once(layers: tuple[RetryLayer, ...]) -> tuple[RetryLayer, ...]:
    """A stack without repeats: a layer reached again round a cycle of calls (a retry by
    recursion re-entering its own function) is the same layer, not one more."""
    seen: set[RetryLayer] = set()
    unique = []
    for layer in layers:
        if layer not in seen:
            seen.add(layer)
            unique.append(layer)
    return tuple(unique)


_WRAPPED_SDK_CLIENTS = frozenset({"root_client", "root_async_client", "client", "async_client"})


def _wrapped_sdk_client(node: ast.expr) -> ast.expr | None:
    """``llm`` in ``llm.root_client``: the LangChain wrapper whose SDK client this is."""
    if isinstance(node, ast.Attribute) and node.attr in _WRAPPED_SDK_CLIENTS:
        return node.value
    return None


def _parameters(scope: _Scope) -> set[str]:
    if not isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
        return set()
    arguments = scope.args
    names = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
    names += [argument for argument in (arguments.vararg, arguments.kwarg) if argument]
    return {argument.arg for argument in names}
