"""``/etc/hvgpu/agent.toml``: every option of ``hvgpu agent`` from a file.

The keys are the command's long option names without the dashes
(``vsock-port = 5170``, ``no-vsock = true``, ``listen = ["unix:///..."]``),
plus ``connect`` and ``control``, the two options of ``hvgpu`` itself that
the agent uses; an option's earlier name, still accepted (hidden from its help),
is a key too, so a file written for an earlier version loads. Nothing here lists
the options: they are read from the click
command, so an option added to ``hvgpu agent`` can be set in the file at once.
Each value is checked as the command line checks it (its type, range, choices
and callback) and an error names the file and the key. The command line (and
the environment variables ``hvgpu`` reads) override the file.

A missing default file is no error (the agent runs on its defaults); a
missing file given with ``--config`` is. Must not run the agent, and must not
know any one option.
"""

from __future__ import annotations

import os
import stat
import textwrap
import tomllib

import click

DEFAULT_PATH = "/etc/hvgpu/agent.toml"
# Options of the `hvgpu` group that `hvgpu agent` uses, settable in the file too.
GROUP_KEYS = ("connect", "control")
# Options of `hvgpu agent` that are about the file itself, or --help.
NOT_KEYS = ("config", "print_config", "help")


def key_of(param: click.Parameter) -> str:
    """The file's key of an option: its longest name without the leading dashes."""
    longest = max((o for o in param.opts if o.startswith("--")), key=len, default=None)
    return longest[2:] if longest else param.name.replace("_", "-")


def settable(ctx: click.Context) -> dict[str, tuple[click.Context, click.Parameter]]:
    """Every key the file may have: (the context it belongs to, its option)."""
    keys = {}
    parent = ctx.parent
    if parent is not None:
        for p in parent.command.params:
            if p.name in GROUP_KEYS:
                keys[key_of(p)] = (parent, p)
    for p in ctx.command.params:
        # an option of the group that the command takes too (--connect after `agent`)
        # is the group's key
        if p.name not in NOT_KEYS and key_of(p) not in keys and isinstance(p, click.Option):
            keys[key_of(p)] = (ctx, p)
    return keys


def _check_trusted(path: str, st: os.stat_result, given: bool) -> None:
    """The file sets who executors run as, who may drive the control socket and where
    guests connect: as sshd and sudo do, refuse one (or a directory above it) that
    someone other than root or the agent's own user may write. Not as root (a user's
    own agent), a file named with --config is the user's to trust."""
    me = os.geteuid()
    if me != 0 and given:
        return
    owners = {0, me}
    checks = [(path, st)]
    parent = os.path.dirname(os.path.abspath(path))
    while True:
        checks.append((parent, os.stat(parent)))
        up = os.path.dirname(parent)
        if up == parent:
            break
        parent = up
    for where, info in checks:
        sticky_dir = stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_ISVTX
        if info.st_uid not in owners or (info.st_mode & 0o022 and not sticky_dir):
            raise click.BadParameter(
                f"{path}: not trusted: {where} is owned by uid {info.st_uid} with mode "
                f"{stat.S_IMODE(info.st_mode):04o}, so someone other than root may change "
                "the agent's options (who executors run as, who may use the control "
                f"socket); make it root's and not group- or world-writable "
                f"(chown root: {where}; chmod go-w {where})", param_hint="--config")


def read(path: str | None) -> tuple[str, dict]:
    """(path, table) of the file; ``path`` None: the default one, which may be missing."""
    given = path is not None
    path = path or DEFAULT_PATH
    try:
        with open(path, "rb") as f:
            _check_trusted(path, os.fstat(f.fileno()), given)
            return path, tomllib.load(f)
    except FileNotFoundError:
        if given:
            raise click.BadParameter(f"{path}: no such file", param_hint="--config") from None
        return path, {}
    except OSError as exc:
        raise click.BadParameter(f"{path}: {exc.strerror}", param_hint="--config") from None
    except tomllib.TOMLDecodeError as exc:
        raise click.BadParameter(f"{path} is not TOML: {exc}", param_hint="--config") from None


def _toml_type(param: click.Parameter) -> tuple[tuple[type, ...], str]:
    """The TOML type(s) a value of ``param`` must have, and how to say it."""
    if isinstance(param, click.Option) and param.is_flag:
        return (bool,), "true or false"
    kind = param.type
    if isinstance(kind, (click.types.IntParamType,)):
        return (int,), "an integer"
    if isinstance(kind, click.types.FloatParamType):
        return (int, float), "a number"
    if isinstance(kind, click.types.BoolParamType):
        return (bool,), "true or false"
    return (str,), "a string"


def check(ctx: click.Context, path: str, table: dict) -> dict[str, tuple[click.Context, str, object]]:
    """Each key of ``table`` checked: {key: (context, parameter name, value)}; a
    click.BadParameter naming the file and key otherwise."""
    keys = settable(ctx)
    out = {}
    for key, value in table.items():
        where = f"{path}: {key!r}"
        if key not in keys:
            near = [k for k in keys if k.replace("-", "_") == key.replace("-", "_")]
            shown = (k for k, (_, p) in keys.items() if not getattr(p, "hidden", False))
            hint = f" (did you mean {near[0]!r}?)" if near else \
                f"; the keys are: {', '.join(sorted(shown))}"
            raise click.BadParameter(f"{where} is not an option of `hvgpu agent`{hint}",
                                     param_hint="--config")
        owner, param = keys[key]
        types, words = _toml_type(param)
        values = value if param.multiple else [value]
        if param.multiple and not isinstance(value, list):
            raise click.BadParameter(f"{where} must be a list of {words[2:]}s "
                                     f"(it is repeatable), not {value!r}", param_hint="--config")
        for v in values:
            if not isinstance(v, types) or (bool not in types and isinstance(v, bool)):
                raise click.BadParameter(f"{where} must be {words}, not {v!r}",
                                         param_hint="--config")
        try:
            processed = param.process_value(owner, list(value) if param.multiple else value)
        except click.BadParameter as exc:
            raise click.BadParameter(f"{where}: {exc.message}", param_hint="--config") from None
        out[key] = (owner, param.name, processed)
    return out


def apply(ctx: click.Context, path: str | None) -> str:
    """Load the file into ``ctx``: the agent's options through its default_map (so the
    command line still wins), the group's into ``ctx.obj`` where the command line and
    environment left them at their defaults. Returns the path read."""
    path, table = read(path)
    values = check(ctx, path, table)
    default_map = dict(ctx.default_map or {})
    for key, (owner, name, value) in values.items():
        if owner is ctx:
            default_map[name] = value
        elif owner.get_parameter_source(name) == click.core.ParameterSource.DEFAULT:
            ctx.obj[name] = value
    ctx.default_map = default_map
    return path


def _literal(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


# Options off by default whose placeholder would not load: what the example shows.
EXAMPLES = {"metrics": "127.0.0.1:9464"}


def _example_value(owner: click.Context, param: click.Parameter):
    if param.name in EXAMPLES:
        return EXAMPLES[param.name]
    default = param.get_default(owner, call=True)
    if not isinstance(default, (str, int, float, list, tuple)):
        default = None  # none, whatever click calls it (newer ones have a sentinel)
    if param.multiple:
        return list(default or ())
    if default is None:
        types, _ = _toml_type(param)
        if bool in types:
            return False
        if int in types:
            return 0
        return getattr(param, "metavar", None) or param.name.upper()
    return default


def example(ctx: click.Context) -> str:
    """A commented agent.toml: every key with its help and its default, commented out."""
    lines = [f"# {DEFAULT_PATH}: the options of `hvgpu agent` (see hvgpu agent --help).",
             "# The command line overrides what is set here. Uncomment to change a default.",
             ""]
    for key, (owner, param) in settable(ctx).items():
        if getattr(param, "hidden", False):
            continue  # an option's earlier name: still read, no longer shown
        text = " ".join((getattr(param, "help", None) or "").split())
        if isinstance(param.type, click.Choice):
            text += f" One of: {', '.join(param.type.choices)}."
        lines += ["# " + line for line in textwrap.wrap(text, 76)]
        lines.append(f"# {key} = {_literal(_example_value(owner, param))}")
        lines.append("")
    return "\n".join(lines)
