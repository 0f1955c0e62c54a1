"""Man pages and shell completion, generated from a command's own definition.

Both commands, ``hvgpu`` (click) and ``hvgpu-guest`` (argparse), describe
themselves once, in their parsers; this module turns that description into a
roff man page (``hvgpu man``, ``hvgpu-guest man``) and, for the argparse one,
bash, zsh and fish completion scripts; click's completion is click's own
(``completion_script``). It reads an argparse parser (``from_argparse``) or a
click group (``from_click``) into the same ``Command``.

It imports click and nothing of hvgpu (the guest ships it). It must not run the
command it describes nor write anywhere: it returns text.
"""

from __future__ import annotations

import argparse
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
    # "command": the rest of the line is a command and its arguments
    rest_is_command: bool = False


@dataclass
class Command:
    name: str  # the program's name, or a subcommand's
    summary: str  # one line
    usage: str  # what follows the name in a synopsis
    description: str = ""  # paragraphs; one starting with "\b" keeps its lines
    options: list[Option] = field(default_factory=list)
    commands: list[Command] = field(default_factory=list)


# ---- reading an argparse parser -------------------------------------------------------

def _expand(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    if not action.help or action.help == argparse.SUPPRESS:
        return ""
    try:  # %(default)s and friends, as --help shows them
        return parser._get_formatter()._expand_help(action)
    except (TypeError, ValueError, KeyError):
        return action.help


def _usage(parser: argparse.ArgumentParser, name: str) -> str:
    text = " ".join(parser.format_usage().split())
    text = text.removeprefix("usage:").strip()
    return text[len(name):].strip() if text.startswith(name) else text


def from_argparse(parser: argparse.ArgumentParser, summary: str = "",
                  name: str | None = None) -> Command:
    name = name or parser.prog
    cmd = Command(name=name, summary=summary or parser.description or "",
                  usage=_usage(parser, parser.prog), description=parser.description or "")
    if parser.epilog:
        cmd.description += "\n\n" + parser.epilog
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for sub_name, sub in action.choices.items():
                cmd.commands.append(from_argparse(sub, helps.get(sub_name, ""), sub_name))
            continue
        if action.help == argparse.SUPPRESS:
            continue
        takes_value = action.nargs != 0
        metavar = None
        if takes_value:
            metavar = action.metavar or (action.dest if not action.option_strings
                                         else action.dest.upper())
            if isinstance(metavar, tuple):
                metavar = " ".join(metavar)
        cmd.options.append(Option(
            flags=list(action.option_strings), metavar=metavar, help=_expand(parser, action),
            choices=[str(c) for c in action.choices or ()],
            rest_is_command=action.nargs == argparse.REMAINDER))
    return cmd


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


# ---- roff ------------------------------------------------------------------------------

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


# ---- completion ------------------------------------------------------------------------

def _words(cmd: Command) -> list[str]:
    return [f for o in cmd.options for f in o.flags] + [c.name for c in cmd.commands]


def _valued(cmd: Command) -> list[Option]:
    return [o for o in cmd.options if o.flags and o.metavar]


def _sh(words) -> str:
    return " ".join(words)


def bash_completion(cmd: Command) -> str:
    """A bash completion script for ``cmd`` and its subcommands (one level)."""
    fn = "_" + re.sub(r"\W", "_", cmd.name)
    subs = "|".join(c.name for c in cmd.commands)
    cases = []
    for c in [cmd, *cmd.commands]:
        label = '""' if c is cmd else c.name
        body = []
        for o in _valued(c):
            pattern = "|".join(o.flags)
            if o.choices:
                body.append(f'        case "$prev" in {pattern}) '
                            f'COMPREPLY=($(compgen -W "{_sh(o.choices)}" -- "$cur")); '
                            f"return;; esac")
            else:
                body.append(f'        case "$prev" in {pattern}) compopt -o default; '
                            f"COMPREPLY=(); return;; esac")
        rest = next((o for o in c.options if o.rest_is_command), None)
        if rest is not None:  # then a command line: a command's name, then its arguments
            body.append(f'        if [[ "$prev" == {c.name} || "$prev" == -- ]]; then '
                        'compopt -o default; COMPREPLY=($(compgen -c -- "$cur")); return; fi')
            body.append('        if [[ "$seen_dashes" == 1 || "$cur" != -* ]]; then '
                        'compopt -o default; COMPREPLY=(); return; fi')
        positional = [o for o in c.options if not o.flags and not o.rest_is_command]
        for o in positional:
            if o.choices:
                body.append(f'        [[ "$cur" != -* ]] && COMPREPLY=($(compgen -W '
                            f'"{_sh(o.choices)}" -- "$cur")) && return')
        body.append(f'        COMPREPLY=($(compgen -W "{_sh(_words(c))}" -- "$cur"))')
        cases.append(f"    {label})\n" + "\n".join(body) + "\n        ;;")
    skip = "|".join(f for o in _valued(cmd) for f in o.flags) or "--"
    return f"""# bash completion for {cmd.name} (generated: {cmd.name} completion bash)
{fn}() {{
    local cur="${{COMP_WORDS[COMP_CWORD]}}" prev="${{COMP_WORDS[COMP_CWORD-1]}}"
    local cmd="" seen_dashes=0 i
    for ((i = 1; i < COMP_CWORD; i++)); do
        case "${{COMP_WORDS[i]}}" in
            {skip}) ((i++)) ;;
            --) seen_dashes=1 ;;
            {subs}) [[ -z "$cmd" ]] && cmd="${{COMP_WORDS[i]}}" ;;
        esac
    done
    case "$cmd" in
{chr(10).join(cases)}
    esac
}}
complete -F {fn} {cmd.name}
"""


def zsh_completion(cmd: Command) -> str:
    """zsh runs the bash script through its bashcompinit."""
    return ("# zsh completion for {0} (generated: {0} completion zsh)\n"
            "autoload -U +X bashcompinit && bashcompinit\n".format(cmd.name)
            + bash_completion(cmd).split("\n", 1)[1])


def _fish_quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def fish_completion(cmd: Command) -> str:
    head = f"complete -c {cmd.name}"
    lines = [f"# fish completion for {cmd.name} (generated: {cmd.name} completion fish)",
             f"{head} -f"]

    def option_lines(c: Command, condition: str) -> None:
        for o in c.options:
            if not o.flags:
                continue
            parts = [head]
            if condition:
                parts += ["-n", _fish_quote(condition)]
            for f in o.flags:
                parts += ["-l", f[2:]] if f.startswith("--") else ["-s", f[1:]]
            if o.metavar:
                parts.append("-r")
                if o.choices:
                    parts += ["-a", _fish_quote(" ".join(o.choices))]
                else:
                    parts.append("-F")
            if o.help:
                parts += ["-d", _fish_quote(" ".join(o.help.split())[:80])]
            lines.append(" ".join(parts))

    option_lines(cmd, "__fish_use_subcommand")
    for c in cmd.commands:
        lines.append(f"{head} -n __fish_use_subcommand -a {c.name} -d "
                     f"{_fish_quote(' '.join(c.summary.split())[:80])}")
        seen = f"__fish_seen_subcommand_from {c.name}"
        option_lines(c, seen)
        for o in c.options:
            if not o.flags and o.choices:
                lines.append(f"{head} -n {_fish_quote(seen)} -a {_fish_quote(' '.join(o.choices))}")
            if o.rest_is_command:
                lines.append(f"{head} -n {_fish_quote(seen)} -a '(__fish_complete_subcommand "
                             f"--fcs-skip=2)'")
    return "\n".join(lines) + "\n"


COMPLETIONS = {"bash": bash_completion, "zsh": zsh_completion, "fish": fish_completion}


def completion_script(group: click.Group, name: str, complete_var: str, shell: str) -> str:
    """click's completion script of ``group`` for ``shell``: sourced, it runs ``name``
    with ``complete_var`` set to ask it what completes the line."""
    from click.shell_completion import get_completion_class

    return get_completion_class(shell)(group, {}, name, complete_var).source()
