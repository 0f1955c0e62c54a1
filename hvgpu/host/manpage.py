"""The ``hvgpu`` click group read into hvgpu.clidoc's ``Command``, for its man page.

It reads the group's parameters and help as ``hvgpu --help`` shows them; it must not
invoke any command.
"""

from __future__ import annotations

import inspect

import click

from hvgpu.clidoc import Command, Option


def _metavar(param: click.Parameter, ctx: click.Context) -> str:
    try:
        return param.make_metavar(ctx)  # click >= 8.2 takes the context
    except TypeError:
        return param.make_metavar()


def _options(command: click.Command, ctx: click.Context) -> list[Option]:
    out = []
    for param in command.get_params(ctx):
        if getattr(param, "hidden", False):
            continue
        if isinstance(param, click.Argument):
            out.append(Option(flags=[], metavar=_metavar(param, ctx)))
            continue
        record = param.get_help_record(ctx)
        flag = getattr(param, "is_flag", False) or getattr(param, "count", False)
        out.append(Option(
            flags=[*param.opts, *param.secondary_opts],
            metavar=None if flag else _metavar(param, ctx),
            help=record[1] if record else "",
            choices=list(param.type.choices) if isinstance(param.type, click.Choice) else []))
    return out


def from_click(group: click.Group, name: str) -> Command:
    ctx = click.Context(group, info_name=name)
    top = Command(name=name, summary=group.get_short_help_str(limit=80),
                  usage=" ".join(group.collect_usage_pieces(ctx)),
                  description=inspect.cleandoc(group.help or ""), options=_options(group, ctx))
    for sub_name in group.list_commands(ctx):
        sub = group.get_command(ctx, sub_name)
        if sub is None or sub.hidden:
            continue
        sub_ctx = click.Context(sub, info_name=sub_name, parent=ctx)
        top.commands.append(Command(
            name=sub_name, summary=sub.get_short_help_str(limit=80),
            usage=" ".join(sub.collect_usage_pieces(sub_ctx)),
            description=inspect.cleandoc(sub.help or ""), options=_options(sub, sub_ctx)))
    return top
