"""MkDocs hook: the reference pages generated from the code at build time.

- ``reference/cli.md``: every command of payonce's click group (usage, help,
  options), walked from :data:`payonce.cli.cli`.
- ``reference/configuration.md``: every field of
  :class:`payonce.config.GatewaySettings`, with the ``payonce serve`` flag, the
  ``PAYONCE_*`` variable and the ``--config`` TOML key that set it.
- ``reference/openapi.md`` and ``reference/openapi.json``: the gateway's own
  endpoints, from :func:`payonce.gateway.openapi.openapi_document`, the document
  the gateway serves at ``/_payonce/openapi.json``.

Nothing is written into docs/: the pages exist only in the built site. The
checkout's ``src/`` goes first on ``sys.path``, so the pages describe the code
beside this mkdocs.yml whatever payonce the virtualenv has installed.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

CLI_PAGE = "reference/cli.md"
CONFIG_PAGE = "reference/configuration.md"
OPENAPI_PAGE = "reference/openapi.md"
OPENAPI_JSON = "reference/openapi.json"


def on_config(config: MkDocsConfig) -> MkDocsConfig:
    src = str(Path(config.config_file_path).resolve().parent / "src")
    if src not in sys.path:
        sys.path.insert(0, src)
    return config


def on_files(files: Files, config: MkDocsConfig) -> Files:
    for path, content in (
        (CLI_PAGE, cli_page()),
        (CONFIG_PAGE, configuration_page()),
        (OPENAPI_PAGE, openapi_page()),
        (OPENAPI_JSON, openapi_json()),
    ):
        files.append(File.generated(config, path, content=content))
    return files


# --- helpers --------------------------------------------------------------------------


def _cell(text: object) -> str:
    """Text safe in one Markdown table cell: no pipes, no raw HTML, one line."""
    value = str(text).replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;")
    return " ".join(value.split())


def _prose(text: str) -> str:
    """Click help text as Markdown paragraphs (``\\b`` blocks kept line by line)."""
    paragraphs = []
    for block in re.split(r"\n\s*\n", inspect.cleandoc(text)):
        if block.startswith("\b"):
            lines = [line for line in block.splitlines()[1:] if line.strip()]
            paragraphs.append("  \n".join(_inline(line) for line in lines))
        else:
            paragraphs.append(_inline(" ".join(block.split())))
    return "\n\n".join(paragraphs)


def _inline(text: str) -> str:
    return text.replace("<", "&lt;").replace("*", "\\*")


# --- the command line -----------------------------------------------------------------


def _commands(command: Any, ctx: Any) -> Iterator[tuple[Any, Any]]:
    import click

    yield command, ctx
    if isinstance(command, click.Group):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is None or sub.hidden:
                continue
            yield from _commands(sub, click.Context(sub, info_name=name, parent=ctx))


def cli_page() -> str:
    import click

    from payonce.cli import cli

    root = click.Context(cli, info_name="payonce")
    out = [
        "# Command line",
        "",
        "Generated at build time from payonce's click commands (`src/payonce/cli.py` and"
        " each part's `cli.py`): what `payonce COMMAND --help` prints, as tables. Every"
        " `payonce serve` flag is also a setting: see [Configuration](configuration.md).",
        "",
    ]
    for command, ctx in _commands(cli, root):
        path = ctx.command_path
        out += [f"## `{path}`", ""]
        usage = " ".join(command.get_usage(ctx).split()).removeprefix("Usage: ")
        out += [f"Usage: `{usage}`", ""]
        if command.help:
            out += [_prose(command.help), ""]
        if isinstance(command, click.Group):
            names = [
                name
                for name in command.list_commands(ctx)
                if (sub := command.get_command(ctx, name)) is not None and not sub.hidden
            ]
            links = ", ".join(f"[`{n}`](#{_slug(path + ' ' + n)})" for n in names)
            out += [f"Commands: {links}.", ""]
        rows = []
        for param in command.get_params(ctx):
            if getattr(param, "hidden", False):
                continue
            rows.append(_param_row(param, ctx))
        if rows:
            out += [
                "| option | type | default | environment | description |",
                "|---|---|---|---|---|",
                *rows,
                "",
            ]
    return "\n".join(out)


def _slug(title: str) -> str:
    """The GitHub anchor of a heading (as mkdocs.yml's slugify makes it)."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def _param_row(param: Any, ctx: Any) -> str:
    import click

    if isinstance(param, click.Argument):
        names = str(param.metavar or str(param.name).upper())
        if param.nargs == -1 and not names.endswith("..."):
            names += "..."
        kind = "argument"
        default = "" if param.required else "(optional)"
    else:
        names = ", ".join(f"`{name}`" for name in (*param.opts, *param.secondary_opts))
        kind = "flag" if param.is_flag and not param.secondary_opts else _type_name(param)
        default = _default(param, ctx)
    envvar = param.envvar if isinstance(param.envvar, str) else ", ".join(param.envvar or ())
    help_text = getattr(param, "help", None) or ""
    if isinstance(param, click.Argument):
        names = f"`{names}`"
    return (
        f"| {names} | {_cell(kind)} | {_cell(default)} | "
        f"{f'`{envvar}`' if envvar else ''} | {_cell(help_text)} |"
    )


def _type_name(param: Any) -> str:
    import click

    if isinstance(param.type, click.Choice):
        return " \\| ".join(str(choice) for choice in param.type.choices)
    name = str(getattr(param.type, "name", "") or "text")
    if param.multiple:
        name += ", repeatable"
    return name


def _default(param: Any, ctx: Any) -> str:
    if not param.show_default and param.default in (None, False, (), []):
        return ""
    default = param.get_default(ctx, call=False)
    # click 8.3 and later: a sentinel for "no default", not a value to show.
    unset = type(default).__name__ == "Sentinel" or str(default).startswith("Sentinel.")
    if unset or callable(default) or default is None or default == () or default == []:
        return ""
    if isinstance(default, bool) and param.secondary_opts:
        return str(param.opts[0] if default else param.secondary_opts[0])
    if isinstance(default, bool):
        return "" if not default else "on"
    return str(default)


# --- the settings ---------------------------------------------------------------------


def configuration_page() -> str:
    from payonce.cli import cli
    from payonce.config import GatewaySettings

    serve = cli.commands["serve"]
    params = {param.name: param for param in serve.params}
    out = [
        "# Configuration",
        "",
        "Everything `payonce serve` can be told, generated at build time from"
        " `payonce.config.GatewaySettings` (one row per field) and the `payonce serve`"
        " option that sets each. A setting comes from, in this order of precedence:",
        "",
        "1. the flag on the command line;",
        "2. the `PAYONCE_*` environment variable;",
        "3. the TOML file named by `--config` (or `PAYONCE_CONFIG`): a flat table, or one"
        " under `[serve]`, whose keys are the setting names with dashes or underscores"
        " (`wait-timeout` or `wait_timeout`);",
        "4. the default.",
        "",
        "Durations take `500ms`, `30s`, `5m`, `24h`, `2d` or a number of seconds; sizes"
        " `10MiB`, `512KB` or a number of bytes. A repeatable setting may be one"
        " comma-separated string in the file or the variable. A bad value stops the"
        " gateway at start-up with one line naming the flag (exit code 2). What each"
        " setting does, in context: [the gateway](../gateway.md#flags).",
        "",
        "| setting: TOML key, flag, variable | type, default | description |",
        "|---|---|---|",
    ]
    for field in dataclasses.fields(GatewaySettings):
        param = params.get(field.name)
        key = field.name.replace("_", "-")
        if field.default is not dataclasses.MISSING:
            default: object = field.default
        elif field.default_factory is not dataclasses.MISSING:
            default = field.default_factory()
        else:
            default = ""
        if param is None:
            flag, envvar, help_text = "", "", "Python API only (`GatewaySettings`)."
        elif getattr(param, "hidden", False):
            flag = ""
            envvar = f"`{param.envvar}`"
            help_text = (
                "Never a flag nor a TOML key (a key on the command line shows in the process"
                " list; a config file gets copied): the variable only."
            )
            key = ""
        else:
            flag = " / ".join(f"`{o}`" for o in (*param.opts, *param.secondary_opts))
            envvar = f"`{param.envvar}`" if param.envvar else ""
            help_text = getattr(param, "help", None) or ""
        # Python-Markdown splits a cell at a pipe even in a code span, and keeps the
        # backslash of an escaped one there: the type is plain text, its pipes entities.
        kind = str(field.type).replace("|", "&#124;").replace("[", "\\[")
        names = "<br>".join(part for part in (f"**`{key}`**" if key else "", flag, envvar) if part)
        out.append(f"| {names} | {kind}, {_setting_default(default)} | {_cell(help_text)} |")
    return "\n".join(out) + "\n"


def _setting_default(default: object) -> str:
    """The default as TOML would spell it (a size in bytes, a duration in seconds)."""
    if default is None or default in ((), {}):
        return "none"
    if isinstance(default, bool):
        return "`true`" if default else "`false`"
    if isinstance(default, str):
        return f'`"{default}"`'
    if isinstance(default, float) and default.is_integer():
        return f"`{int(default)}`"
    return f"`{default}`"


# --- the gateway's own HTTP API -------------------------------------------------------


def _local_links(text: str) -> str:
    """Relative links of the document (``problems.md#x``) as seen from reference/."""
    return re.sub(r"\]\((?![a-z]+:|#|/)", "](../", text)


def _schema(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{_slug('schema ' + name)})"
    if "allOf" in schema:
        return " + ".join(_schema(part) for part in schema["allOf"] if "$ref" in part) or "object"
    if "enum" in schema:
        return " \\| ".join(f"`{value}`" for value in schema["enum"])
    kind = schema.get("type", "any")
    if isinstance(kind, list):
        return " or ".join(f"`{k}`" for k in kind)
    return f"`{kind}`"


def openapi_page() -> str:
    from payonce.gateway.openapi import openapi_document

    document = openapi_document()
    info = document["info"]
    out = [
        "# HTTP API (OpenAPI)",
        "",
        f"The gateway's own endpoints, from the OpenAPI {document['openapi']} document"
        " it serves at `/_payonce/openapi.json` (generated at build time from"
        " `payonce.gateway.openapi`; the same document as [JSON](openapi.json)). Every"
        " other path is the upstream's API, proxied: [the gateway](../gateway.md).",
        "",
        f"**{info['title']}**, version {info['version']}.",
        "",
        _local_links(info.get("description", "")),
        "",
    ]
    for path, methods in document["paths"].items():
        shared = methods.get("parameters", [])
        for method, operation in methods.items():
            if method not in ("get", "head", "post", "put", "patch", "delete", "options"):
                continue
            operation = {**operation, "parameters": [*shared, *operation.get("parameters", [])]}
            out += [f"## `{method.upper()} {path}`", ""]
            out += [_local_links(operation.get("summary", "")), ""]
            if operation.get("description"):
                out += [_local_links(operation["description"]), ""]
            if operation.get("security"):
                schemes = sorted({name for item in operation["security"] for name in item})
                out += ["Credentials: " + ", ".join(f"`{s}`" for s in schemes) + ".", ""]
            if operation.get("parameters"):
                out += [
                    "| parameter | in | required | schema | description |",
                    "|---|---|---|---|---|",
                ]
                for parameter in operation["parameters"]:
                    out.append(
                        f"| `{parameter['name']}` | {parameter['in']} |"
                        f" {'yes' if parameter.get('required') else 'no'} |"
                        f" {_schema(parameter.get('schema', {}))} |"
                        f" {_cell(_local_links(parameter.get('description', '')))} |"
                    )
                out.append("")
            out += ["| status | body | description |", "|---|---|---|"]
            for status, response in operation["responses"].items():
                if "$ref" in response:
                    name = response["$ref"].rsplit("/", 1)[-1]
                    response = document["components"]["responses"][name]
                bodies = [
                    f"`{media}` {_schema(content.get('schema', {}))}"
                    for media, content in response.get("content", {}).items()
                ]
                out.append(
                    f"| {status} | {'; '.join(bodies)} |"
                    f" {_cell(_local_links(response.get('description', '')))} |"
                )
            out.append("")
    out += ["## Schemas", ""]
    for name, schema in document["components"]["schemas"].items():
        out += [f"### Schema {name}", ""]
        if schema.get("description"):
            out += [_local_links(schema["description"]), ""]
        properties = schema.get("properties", {})
        if properties:
            required = set(schema.get("required", ()))
            out += ["| field | required | schema | description |", "|---|---|---|---|"]
            for field, spec in properties.items():
                out.append(
                    f"| `{field}` | {'yes' if field in required else 'no'} | {_schema(spec)} |"
                    f" {_cell(_local_links(spec.get('description', '')))} |"
                )
            out.append("")
    out += ["## Credentials", "", "| scheme | type | description |", "|---|---|---|"]
    for name, scheme in document["components"]["securitySchemes"].items():
        where = scheme.get("scheme") or f"header `{scheme.get('name')}`"
        out.append(
            f"| `{name}` | {scheme['type']} ({where}) |"
            f" {_cell(_local_links(scheme.get('description', '')))} |"
        )
    return "\n".join(out) + "\n"


def openapi_json() -> str:
    from payonce.gateway.openapi import openapi_document

    return json.dumps(openapi_document(), indent=2) + "\n"


# --- the Python API page --------------------------------------------------------------

# ``~`` shows the last name only, as Sphinx does.
_ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|exc|obj):(<code>)(?:~(?:[\w.]+\.)?)?")
_LITERAL = re.compile(r"<p>::</p>\s*|(?<=\w)::(?=</p>)")


def on_page_content(html: str, page: Any, config: MkDocsConfig, files: Files) -> str:
    """Docstrings are written for Sphinx: drop its roles and ``::`` markers on the API page.

    ``:class:`~payonce.client.RetryPolicy``` renders as ``RetryPolicy`` in code, and
    a paragraph ending in ``::`` (a literal block follows) ends in ``:``.
    """
    if page.file.src_uri != "reference/api.md":
        return html

    def role(match: re.Match[str]) -> str:
        return match.group(1)

    html = _ROLE.sub(role, html)
    return _LITERAL.sub(lambda m: "" if m.group(0).startswith("<p>") else ":", html)
