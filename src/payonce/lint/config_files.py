"""Proxy configuration rules: nginx (PO501), Envoy (PO502), LiteLLM proxy (PO503).

A proxy in front of an LLM API is a retry layer the application cannot see:
it multiplies whatever the SDKs and the application already do. These rules
only judge routes that reach an LLM (an OpenAI/Anthropic-style host, or a
``/v1/chat/completions``, ``/v1/completions``, ``/v1/messages`` or
``/v1/responses`` path); other routes may retry as they like.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from payonce.lint.findings import Finding
from payonce.lint.nginx import Directive, NginxError, parse_nginx
from payonce.lint.sdk import SDK_DEFAULT_RETRIES, looks_like_llm_url
from payonce.lint.timeouts import MIN_READ_TIMEOUT
from payonce.lint.yaml_subset import YamlError, YamlNode, parse_documents

__all__ = ["check_nginx", "check_yaml", "is_nginx_text", "is_proxy_yaml_text"]

_CALLER_ATTEMPTS = SDK_DEFAULT_RETRIES + 1
_NGINX_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d)?$")
_ENVOY_DURATION = re.compile(r"^(\d+(?:\.\d+)?)s$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
# LiteLLM's Router: num_retries when nothing sets it (openai.DEFAULT_MAX_RETRIES), and
# the retry-policy fields whose errors can come after the provider generated and billed
# (a timeout, a 500 or 503 from a provider or a proxy, anything else: DefaultRetries).
_LITELLM_DEFAULT_RETRIES = 2
_LITELLM_BILLED_RETRY_FIELDS = (
    "TimeoutErrorRetries",
    "InternalServerErrorRetries",
    "ServiceUnavailableErrorRetries",
    "DefaultRetries",
)
_ENVOY_RESENDING = ("5xx", "gateway-error", "reset", "retriable-status-codes")
_NGINX_MARKERS = ("proxy_pass", "proxy_next_upstream")
_YAML_MARKERS = (
    "retry_policy",
    "virtual_hosts",
    "static_resources",
    "model_list",
    "litellm_settings",
    "router_settings",
)


def is_nginx_text(text: str) -> bool:
    return any(marker in text for marker in _NGINX_MARKERS)


def is_proxy_yaml_text(text: str) -> bool:
    return any(marker in text for marker in _YAML_MARKERS)


# -- nginx ------------------------------------------------------------------------


def check_nginx(text: str, path: str) -> list[Finding]:
    """PO501 and PO301 findings in one nginx configuration file (PO902 if unreadable)."""
    try:
        root = parse_nginx(text)
    except NginxError as exc:
        return [_finding(path, exc.line, "PO902", f"nginx configuration not parsed: {exc}")]
    upstreams = {
        block.args[0]: [
            server.args[0]
            for server in block.children or ()
            if server.name == "server" and server.args
        ]
        for block in _walk(root)
        if block.name == "upstream" and block.args and block.children is not None
    }
    findings: dict[tuple[int, str], Finding] = {}
    for location, inherited in _locations(root, {}):
        proxy_pass = location.find("proxy_pass")
        if proxy_pass is None or not proxy_pass.args:
            continue
        target = proxy_pass.args[0]
        name = re.sub(r"^\w+://", "", target).split("/")[0].split(":")[0]
        servers = upstreams.get(name, [])
        route = " ".join(location.args)
        if not (
            looks_like_llm_url(route)
            or looks_like_llm_url(target)
            or any(looks_like_llm_url(server) for server in servers)
        ):
            continue
        settings = {**inherited, **_settings(location)}
        next_upstream = settings.get("proxy_next_upstream")
        if next_upstream is not None:
            finding = _next_upstream_finding(path, next_upstream, settings, servers, route)
            if finding is not None:
                findings[(finding.line, finding.code)] = finding
        read_timeout = settings.get("proxy_read_timeout")
        seconds = (
            _nginx_seconds(read_timeout.args[0]) if read_timeout and read_timeout.args else None
        )
        if read_timeout is not None and seconds is not None and seconds < MIN_READ_TIMEOUT:
            findings[(read_timeout.line, "PO301")] = _finding(
                path,
                read_timeout.line,
                "PO301",
                f"proxy_read_timeout {read_timeout.args[0]} on the LLM location {route}: nginx"
                " gives up on generations the upstream still finishes and bills; use 60s or more",
            )
    return list(findings.values())


def _next_upstream_finding(
    path: str,
    directive: Directive,
    settings: dict[str, Directive],
    servers: list[str],
    route: str,
) -> Finding | None:
    resending = [arg for arg in directive.args if arg in {"timeout", "non_idempotent"}]
    if not resending:
        return None
    tries_directive = settings.get("proxy_next_upstream_tries")
    tries = tries_directive.args[0] if tries_directive and tries_directive.args else "0"
    if tries not in {"", "0"}:
        attempts = f"up to {tries} billed calls per request"
    elif servers:
        attempts = f"up to {len(servers)} billed calls per request (one per upstream server)"
    else:
        attempts = "one billed call per upstream server"
    if "non_idempotent" in resending:
        why = "re-sends POSTs that already reached the upstream"
    else:
        # nginx >= 1.9.13 only re-sends a POST that was sent with non_idempotent;
        # older nginx, and requests nginx takes for idempotent, are re-sent.
        why = "re-sends requests the upstream may be computing (any POST before nginx 1.9.13)"
    return _finding(
        path,
        directive.line,
        "PO501",
        f"proxy_next_upstream {' '.join(resending)} on the LLM location {route} {why}:"
        f" {attempts}, times the callers' SDK retries; use 'proxy_next_upstream error' only",
    )


def _locations(
    block: Directive, inherited: dict[str, Directive]
) -> Iterator[tuple[Directive, dict[str, Directive]]]:
    for child in block.children or ():
        if child.children is None:
            continue
        if child.name == "location":
            yield child, inherited
        yield from _locations(child, {**inherited, **_settings(child)})


def _settings(block: Directive) -> dict[str, Directive]:
    names = ("proxy_next_upstream", "proxy_next_upstream_tries", "proxy_read_timeout")
    found = {}
    for name in names:
        directive = block.find(name)
        if directive is not None:
            found[name] = directive
    return found


def _walk(block: Directive) -> Iterator[Directive]:
    for child in block.children or ():
        yield child
        yield from _walk(child)


def _nginx_seconds(text: str) -> float | None:
    match = _NGINX_DURATION.match(text)
    if match is None:
        return None
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]


# -- YAML: Envoy and LiteLLM --------------------------------------------------------


def check_yaml(text: str, path: str) -> list[Finding]:
    """PO502/PO503/PO301 findings in one YAML file (PO902 if it is not readable)."""
    try:
        documents = parse_documents(text)
    except YamlError as exc:
        return [_finding(path, exc.line, "PO902", f"YAML not parsed: {exc}")]
    findings: list[Finding] = []
    for document in documents:
        if isinstance(document.value, dict) and {
            "model_list",
            "litellm_settings",
            "router_settings",
        } & set(document.value):
            findings.extend(_check_litellm(document, path))
        else:
            findings.extend(_check_envoy(document, path))
    return findings


def _nodes(node: YamlNode) -> Iterator[YamlNode]:
    yield node
    if isinstance(node.value, dict):
        for child in node.value.values():
            yield from _nodes(child)
    elif isinstance(node.value, list):
        for child in node.value:
            yield from _nodes(child)


def _texts(node: YamlNode) -> Iterator[str]:
    for child in _nodes(node):
        if isinstance(child.value, str):
            yield child.value


def _check_envoy(document: YamlNode, path: str) -> list[Finding]:
    llm_clusters: set[str] = set()
    for node in _nodes(document):
        for cluster in (node.get("clusters") or YamlNode([], 0)).items():
            name = cluster.get("name")
            if name is not None and any(looks_like_llm_url(text) for text in _texts(cluster)):
                llm_clusters.add(str(name.value))
    findings: list[Finding] = []
    for vhost in _nodes(document):
        routes = vhost.get("routes")
        if routes is None or not isinstance(routes.value, list):
            continue
        domains = [text for text in _texts(vhost.get("domains") or YamlNode(None, 0))]
        vhost_llm = any(looks_like_llm_url(domain) for domain in domains)
        vhost_policy = vhost.get("retry_policy")
        for route in routes.items():
            action = route.get("route")
            if action is None:
                continue
            if not (vhost_llm or _envoy_route_is_llm(route, action, llm_clusters)):
                continue
            policy = action.get("retry_policy") or vhost_policy
            if policy is not None:
                findings.extend(_envoy_policy(policy, path, _envoy_match(route)))
            findings.extend(_envoy_timeout(route, action, path))
    return findings


def _envoy_match(route: YamlNode) -> str:
    match = route.get("match")
    for key in ("path", "prefix", "path_separated_prefix"):
        value = match.get(key) if match else None
        if value is not None:
            return str(value.value)
    regex = match.get("safe_regex") if match else None
    inner = regex.get("regex") if regex else None
    return str(inner.value) if inner is not None else "(route)"


def _envoy_route_is_llm(route: YamlNode, action: YamlNode, llm_clusters: set[str]) -> bool:
    if looks_like_llm_url(_envoy_match(route)):
        return True
    cluster = action.get("cluster")
    if cluster is not None and str(cluster.value) in llm_clusters:
        return True
    weighted = action.get("weighted_clusters")
    if weighted is not None and any(text in llm_clusters for text in _texts(weighted)):
        return True
    rewrite = action.get("host_rewrite_literal")
    return rewrite is not None and looks_like_llm_url(str(rewrite.value))


def _envoy_policy(policy: YamlNode, path: str, route: str) -> list[Finding]:
    retry_on = policy.get("retry_on")
    tokens = [token.strip() for token in str(retry_on.value if retry_on else "").split(",")]
    resending = [token for token in tokens if token in _ENVOY_RESENDING]
    if not resending or retry_on is None:
        return []
    retries_node = policy.get("num_retries")
    retries = retries_node.value if retries_node is not None else 1  # Envoy's default
    attempts = (
        f"up to {retries + 1} billed calls per request, {(retries + 1) * _CALLER_ATTEMPTS} with"
        " the callers' default SDK retries"
        if isinstance(retries, int)
        else "num_retries not readable"
    )
    per_try = policy.get("per_try_timeout")
    per_try_note = (
        f"; per_try_timeout {_envoy_text(per_try)} abandons attempts the upstream keeps billing"
        if per_try is not None
        else ""
    )
    return [
        _finding(
            path,
            retry_on.line,
            "PO502",
            f"Envoy retry_on {','.join(resending)} on the LLM route {route} re-sends requests the"
            f" upstream may already be billing: {attempts}{per_try_note}; retry only"
            " connect-failure,refused-stream,reset-before-request",
        )
    ]


def _envoy_timeout(route: YamlNode, action: YamlNode, path: str) -> list[Finding]:
    timeout = action.get("timeout")
    if timeout is None:
        return [
            _finding(
                path,
                route.line,
                "PO301",
                f"the LLM route {_envoy_match(route)} has no timeout: Envoy's default route"
                " timeout is 15s, shorter than many generations the upstream finishes and"
                " bills; set timeout: 120s (or 0s and a client-side deadline)",
            )
        ]
    seconds = _envoy_seconds(timeout)
    if seconds is not None and 0 < seconds < MIN_READ_TIMEOUT:
        return [
            _finding(
                path,
                timeout.line,
                "PO301",
                f"route timeout {_envoy_text(timeout)} on the LLM route {_envoy_match(route)}:"
                " generations still running then are finished and billed anyway; use 60s or more",
            )
        ]
    return []


def _envoy_seconds(node: YamlNode) -> float | None:
    if isinstance(node.value, dict):
        seconds = node.get("seconds")
        return float(seconds.value) if seconds and isinstance(seconds.value, int | float) else None
    match = _ENVOY_DURATION.match(str(node.value))
    return float(match.group(1)) if match else None


def _envoy_text(node: YamlNode) -> str:
    seconds = _envoy_seconds(node)
    return f"{seconds:g}s" if seconds is not None else str(node.value)


def _check_litellm(document: YamlNode, path: str) -> list[Finding]:
    """PO503 and PO301 in a LiteLLM proxy config, judged as LiteLLM's Router resolves them.

    A deployment's ``litellm_params.num_retries`` wins over ``router_settings.num_retries``,
    which wins over ``litellm_settings.num_retries``; with none of them set, the Router
    retries a failed call ``_LITELLM_DEFAULT_RETRIES`` times. A ``retry_policy`` (or
    ``model_group_retry_policy``) in ``router_settings`` wins over all of them for the
    errors it names. The Router builds its provider SDK clients with ``max_retries: 0``
    unless a deployment sets its own. (LiteLLM 1.108.7, measured in
    ``tests/upstreams/test_litellm.py``: a timed-out call is billed once per attempt.)
    """
    findings: list[Finding] = []
    configured = False  # a proxy-wide num_retries, whatever its value
    for section in ("litellm_settings", "router_settings"):
        settings = document.get(section)
        if settings is None:
            continue
        configured = configured or settings.get("num_retries") is not None
        # The Router's SDK clients default to max_retries 0; a deployment that sets more
        # gets its own finding.
        findings.extend(_litellm_retries(settings, f"{section}.num_retries", path, 0))
        for key in ("request_timeout", "timeout", "stream_timeout"):
            findings.extend(_litellm_timeout(settings.get(key), f"{section}.{key}", path))
    findings.extend(_litellm_retry_policies(document.get("router_settings"), path))
    model_list = document.get("model_list")
    defaulted: list[str] = []
    for model in (model_list or YamlNode([], 0)).items():
        params = model.get("litellm_params")
        if params is None:
            continue
        name = model.get("model_name")
        label = f"model_list[{name.value if name else '?'}].litellm_params"
        if params.get("num_retries") is None:
            defaulted.append(str(name.value) if name else "?")
        max_retries = params.get("max_retries")
        deployment = max_retries.value if max_retries is not None else 0
        findings.extend(_litellm_retries(params, f"{label}.num_retries", path, deployment))
        if isinstance(deployment, int) and deployment > 0:
            findings.append(
                _finding(
                    path,
                    max_retries.line if max_retries else params.line,
                    "PO503",
                    f"{label}.max_retries: {deployment}: the proxy's provider SDK re-sends"
                    f" each call up to {deployment + 1} times, on top of the callers' SDK"
                    f" retries ({_CALLER_ATTEMPTS} attempts by default):"
                    f" {(deployment + 1) * _CALLER_ATTEMPTS} billed calls at worst; set it to 0",
                )
            )
        for key in ("timeout", "stream_timeout"):
            findings.extend(_litellm_timeout(params.get(key), f"{label}.{key}", path))
    if model_list is not None and defaulted and not configured:
        findings.append(_litellm_default_retries(model_list.line, defaulted, path))
    return findings


def _litellm_default_retries(line: int, names: list[str], path: str) -> Finding:
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    attempts = _LITELLM_DEFAULT_RETRIES + 1
    return _finding(
        path,
        line,
        "PO503",
        f"num_retries is set nowhere for {shown} (not per deployment, not in router_settings"
        f" or litellm_settings): LiteLLM's Router then retries each failed call"
        f" {_LITELLM_DEFAULT_RETRIES} times by default: {attempts} x {_CALLER_ATTEMPTS}"
        f" (callers' default max_retries=2) = {attempts * _CALLER_ATTEMPTS} billed calls at"
        " worst; keep one layer: router_settings: num_retries: 0, or max_retries=0 in every"
        " caller",
    )


def _litellm_retry_policies(router: YamlNode | None, path: str) -> list[Finding]:
    """PO503 for retry-policy entries that re-send calls the provider may have billed."""
    if router is None:
        return []
    policies: list[tuple[str, YamlNode]] = []
    policy = router.get("retry_policy")
    if policy is not None:
        policies.append(("router_settings.retry_policy", policy))
    by_group = router.get("model_group_retry_policy")
    if by_group is not None and isinstance(by_group.value, dict):
        policies.extend(
            (f"router_settings.model_group_retry_policy.{group}", node)
            for group, node in by_group.value.items()
        )
    findings = []
    for label, node in policies:
        for field in _LITELLM_BILLED_RETRY_FIELDS:
            value = node.get(field)
            if value is None or isinstance(value.value, bool) or not isinstance(value.value, int):
                continue
            if value.value <= 0:
                continue
            findings.append(
                _finding(
                    path,
                    value.line,
                    "PO503",
                    f"{label}.{field}: {value.value}: LiteLLM re-sends such a failed call up to"
                    f" {value.value} more time{'s' if value.value > 1 else ''}, whatever"
                    " num_retries says, on top of the"
                    f" callers' SDK retries: {value.value + 1} x {_CALLER_ATTEMPTS} (callers'"
                    f" default max_retries=2) = {(value.value + 1) * _CALLER_ATTEMPTS} billed"
                    f" calls at worst; set {field}: 0",
                )
            )
    return findings


def _litellm_retries(
    settings: YamlNode, label: str, path: str, deployment_retries: object
) -> list[Finding]:
    node = settings.get("num_retries")
    if node is None or not isinstance(node.value, int) or isinstance(node.value, bool):
        return []
    if node.value <= 0:
        return []
    known = isinstance(deployment_retries, int) and not isinstance(deployment_retries, bool)
    sdk = deployment_retries + 1 if known and isinstance(deployment_retries, int) else None
    worst = (node.value + 1) * (sdk or 1) * _CALLER_ATTEMPTS
    total = f"= {worst}" if sdk is not None else f"= at least {worst}"
    return [
        _finding(
            path,
            node.line,
            "PO503",
            f"{label}: {node.value}: the LiteLLM proxy re-sends each call up to {node.value + 1}"
            f" times on top of the callers' SDK retries: {node.value + 1} x {sdk or '?'} (proxy"
            f" SDK) x {_CALLER_ATTEMPTS} (callers' default max_retries=2) {total} billed calls at"
            " worst; keep one layer: num_retries: 0 here, or max_retries=0 in every caller",
        )
    ]


def _litellm_timeout(node: YamlNode | None, label: str, path: str) -> list[Finding]:
    if node is None or isinstance(node.value, bool) or not isinstance(node.value, int | float):
        return []
    if node.value >= MIN_READ_TIMEOUT:
        return []
    return [
        _finding(
            path,
            node.line,
            "PO301",
            f"{label}: {node.value:g}: the proxy gives up on generations still running after"
            f" {node.value:g}s, which the provider finishes and bills; use 60 or more",
        )
    ]


def _finding(path: str, line: int, code: str, message: str) -> Finding:
    return Finding(path, max(line, 1), 1, code, message, max(line, 1), 1)
