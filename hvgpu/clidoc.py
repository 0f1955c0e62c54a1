"""Man pages and shell completion, generated from a command's own definition.

Both commands, ``hvgpu`` and ``hvgpu-guest``, are click groups that describe
themselves once, in their decorators and docstrings. This module reads such a
group into a ``Command`` and turns that into a roff man page (``hvgpu man``,
``hvgpu-guest man``); completion is click's own (``completion_script``): the
script a shell sources calls the command back, so it completes from the same
definition.

It imports click and nothing of hvgpu (the guest ships it). It must not run the
command it describes nor write anywhere: it returns text.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, field

import click


@dataclass
class Option:
    """One option (``flags`` such as ``["-c", "--connect"]``) or, with no flags, one
    positional argument. ``metavar`` names the value it takes (None: a flag)."""

    flags: list[str]
    metavar: str | None
    help: str = ""
    choices: list[str] = field(default_factory=list)


@dataclass
class Command:
    name: str  # the program's name, or a subcommand's
    summary: str  # one line
    usage: str  # what follows the name in a synopsis
    description: str = ""  # paragraphs; one starting with "\b" keeps its lines
    options: list[Option] = field(default_factory=list)
    commands: list[Command] = field(default_factory=list)


# ---- reading a click group ----------------------------------------------------------

def _metavar(param: click.Parameter, ctx: click.Context) -> str:
    try:
        return param.make_metavar(ctx)  # click >= 8.2 takes the context
    except TypeError:
        return param.make_metavar()


def _choices(param: click.Parameter) -> list[str]:
    return [str(c) for c in param.type.choices] if isinstance(param.type, click.Choice) else []


def _options(command: click.Command, ctx: click.Context) -> list[Option]:
    out = []
    for param in command.get_params(ctx):
        if getattr(param, "hidden", False):
            continue
        if isinstance(param, click.Argument):
            out.append(Option(flags=[], metavar=_metavar(param, ctx), choices=_choices(param)))
            continue
        record = param.get_help_record(ctx)
        flag = getattr(param, "is_flag", False) or getattr(param, "count", False)
        out.append(Option(flags=[*param.opts, *param.secondary_opts],
                          metavar=None if flag else _metavar(param, ctx),
                          help=record[1] if record else "", choices=_choices(param)))
    return out


def _command(command: click.Command, ctx: click.Context, name: str) -> Command:
    text = inspect.cleandoc(command.help or "")
    if command.epilog:
        text += "\n\n" + inspect.cleandoc(command.epilog)
    return Command(name=name, summary=command.get_short_help_str(limit=80),
                   usage=" ".join(command.collect_usage_pieces(ctx)), description=text,
                   options=_options(command, ctx))


def from_click(group: click.Group, name: str) -> Command:
    """``group`` and its subcommands (one level), as ``name --help`` shows them."""
    # each with its context_settings, as running it has them (-h beside --help)
    ctx = click.Context(group, info_name=name, **group.context_settings)
    top = _command(group, ctx, name)
    for sub_name in group.list_commands(ctx):
        sub = group.get_command(ctx, sub_name)
        if sub is None or sub.hidden:
            continue
        sub_ctx = click.Context(sub, info_name=sub_name, parent=ctx, **sub.context_settings)
        top.commands.append(_command(sub, sub_ctx, sub_name))
    return top


# ---- roff --------------------------------------------------------------------------

def _roff(text: str) -> str:
    """Text as roff takes it literally: backslashes, minus signs, control characters."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join("\\&" + line if line.startswith((".", "'")) else line
                     for line in text.split("\n"))


def _paragraphs(text: str) -> list[str]:
    out = []
    for para in re.split(r"\n\s*\n", text.strip()):
        if para.startswith("\b"):  # click's mark: keep these lines as they are
            lines = para[1:].strip("\n").split("\n")
            out.append(".PP\n.nf\n" + "\n".join(_roff(line) for line in lines) + "\n.fi")
        elif para.strip():
            out.append(".PP\n" + _roff(" ".join(para.split())))
    return out


def _option_item(opt: Option) -> str:
    if opt.flags:
        head = ", ".join(f"\\fB{_roff(f)}\\fR" for f in opt.flags)
        if opt.metavar:
            head += f" \\fI{_roff(opt.metavar)}\\fR"
    else:
        head = f"\\fI{_roff(opt.metavar or '')}\\fR"
    body = _roff(" ".join(opt.help.split())) if opt.help else ""
    if opt.choices and not all(c.lower() in (opt.metavar or "").lower() for c in opt.choices):
        body += (" " if body else "") + "One of: " + ", ".join(_roff(c) for c in opt.choices) + "."
    return f".TP\n{head}\n{body}".rstrip()


def man_page(cmd: Command, version: str, see_also: list[str] = ()) -> str:
    """The command as a section-1 man page (roff, for ``man -l``)."""
    upper = cmd.name.upper()
    lines = [f'.TH "{_roff(upper)}" 1 "" "{_roff(cmd.name)} {_roff(version)}" "User Commands"',
             ".nh", ".ad l",  # no hyphenated options, no stretched synopsis
             ".SH NAME", f"{_roff(cmd.name)} \\- {_roff(cmd.summary.rstrip('.'))}",
             ".SH SYNOPSIS", f".B {_roff(cmd.name)}", _roff(cmd.usage)]
    for sub in cmd.commands:
        lines += [".br", f".B {_roff(cmd.name)} {_roff(sub.name)}", _roff(sub.usage)]
    lines += [".SH DESCRIPTION", *_paragraphs(cmd.description or cmd.summary)]
    lines += [".SH OPTIONS", *(_option_item(o) for o in cmd.options)]
    if cmd.commands:
        lines.append(".SH COMMANDS")
        for sub in cmd.commands:
            lines += [f'.SS "{_roff(cmd.name)} {_roff(sub.name)}"',
                      *_paragraphs(sub.description or sub.summary)]
            items = [_option_item(o) for o in sub.options]
            if items:
                lines += [".PP", "Options:", *items]
    if see_also:
        lines += [".SH SEE ALSO", ",\n".join(f".BR {_roff(n)} (1)" for n in see_also)]
    return "\n".join(lines) + "\n"


# ---- completion --------------------------------------------------------------------

SHELLS = ("bash", "zsh", "fish")


def completion_script(group: click.Group, name: str, complete_var: str, shell: str) -> str:
    """click's completion script of ``group`` for ``shell``: sourced, it runs ``name``
    with ``complete_var`` set to ask it what completes the line."""
    from click.shell_completion import get_completion_class

    return get_completion_class(shell)(group, {}, name, complete_var).source()
