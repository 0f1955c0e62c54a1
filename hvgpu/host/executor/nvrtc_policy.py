"""What a guest may ask of NVRTC: allowed options, program and header names, includes.

Guest CUDA C++ is compiled on the host, so every option and every ``#include``
is a way to reach host files: ``--time=FILE`` appends to a file,
``--create-pch=FILE`` overwrites one, ``-I/etc`` or ``#include "/etc/shadow"``
quotes a host file back in the build log. This module decides, before NVRTC
sees anything: options come from an allow-list (an option that names a file
or a path is refused, naming the option); a program or header name is a plain
relative name; an ``#include`` names a header the guest sent or a toolkit
header by a relative name, never an absolute path, ``..`` or a macro.
The compiling child is confined as well (``compiler``), so the checks here
are the first of two walls, not the only one.

Pure functions; must not compile, read files or touch CUDA.
"""

from __future__ import annotations

import re

from hvgpu.errors import CudaError
from hvgpu.virtio import protocol as P

MAX_SOURCE = 16 << 20  # one program's source plus its headers
MAX_HEADERS = 256
MAX_OPTIONS = 256
MAX_OPTION_LEN = 4096

_BOOL = r"(true|false)"
_NUMS = r"\d+(,\d+)*"
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
# Each entry: the option's spellings (long and short) and the value it takes
# after "=" (None: a flag that takes none). Nothing here names a file.
_VALUED = {
    ("--gpu-architecture", "-arch"): r"(sm|compute|lto)_\d{2,3}[af]?",
    ("--std", "-std"): r"c\+\+(03|11|14|17|20)",
    ("--relocatable-device-code", "-rdc"): _BOOL,
    ("--dopt", "-dopt"): r"(on|off)",
    ("--maxrregcount", "-maxrregcount"): r"\d{1,4}",
    ("--ftz", "-ftz"): _BOOL,
    ("--prec-sqrt", "-prec-sqrt"): _BOOL,
    ("--prec-div", "-prec-div"): _BOOL,
    ("--fmad", "-fmad"): _BOOL,
    ("--modify-stack-limit", "-modify-stack-limit"): _BOOL,
    ("--builtin-move-forward", "-builtin-move-forward"): _BOOL,
    ("--builtin-initializer-list", "-builtin-initializer-list"): _BOOL,
    ("--diag-error", "-diag-error"): _NUMS,
    ("--diag-suppress", "-diag-suppress"): _NUMS,
    ("--diag-warn", "-diag-warn"): _NUMS,
    ("--brief-diagnostics", "-brief-diag"): _BOOL,
    ("--device-stack-protector", "-device-stack-protector"): _BOOL,
    ("--optimization-info", "-opt-info"): r"inline",
    ("--ptxas-options", "-Xptxas"): (r"(-v|--verbose|-O[0-3]|--warn-on-spills|-warn-spills|"
                                     r"--warn-on-local-memory-usage|-warn-lmem-usage|"
                                     r"--maxrregcount=\d{1,4}|-maxrregcount=\d{1,4})"),
}
_FLAGS = {
    "--device-c", "-dc", "--device-w", "-dw", "--extensible-whole-program", "-ewp",
    "--device-debug", "-G", "--generate-line-info", "-lineinfo",
    "--use_fast_math", "-use_fast_math", "--extra-device-vectorization",
    "-extra-device-vectorization", "--dlink-time-opt", "-dlto", "--gen-opt-lto", "-gen-opt-lto",
    "--disable-warnings", "-w", "--restrict", "-restrict",
    "--device-as-default-execution-space", "-default-device", "--device-int128",
    "-device-int128", "--display-error-number", "-err-no", "--no-display-error-number",
    "-no-err-no", "--no-source-include", "-no-source-include", "--minimal", "-minimal",
    "--fdevice-syntax-only", "-fdevice-syntax-only", "--Wreorder", "-Wreorder",
    "--Wno-deprecated-declarations", "-Wno-deprecated-declarations",
    "--Wdefault-stream-launch", "-Wdefault-stream-launch", "--Wmissing-launch-bounds",
    "-Wmissing-launch-bounds", "--Wext-lambda-captures-this", "-Wext-lambda-captures-this",
    "--Wno-deprecated-gpu-targets", "-Wno-deprecated-gpu-targets",
}
# Refused with the reason that matters: they read or write host files or directories.
_NAMES_FILES = ("--include-path", "-I", "--time", "--fdevice-time-trace", "--create-pch",
                "--use-pch", "--pch-dir", "--pch", "-pch", "--pch-messages", "--pch-verbose",
                "--instantiate-templates-in-pch", "--split-compile", "-split-compile")
_PRE_INCLUDE = ("--pre-include", "-include")
_DEFINE = re.compile(rf"(--define-macro=|-D)({_IDENT})(=[^\s\0]*)?")
_UNDEFINE = re.compile(rf"(--undefine-macro=|-U)({_IDENT})")
_NAME = re.compile(r"[A-Za-z0-9_+-][A-Za-z0-9_.+-]{0,127}")
_HEADER = re.compile(r"[A-Za-z0-9_+-][A-Za-z0-9_.+-]*(/[A-Za-z0-9_+-][A-Za-z0-9_.+-]*)*")


def _refuse(message: str):
    raise CudaError(P.CUDA_ERROR_INVALID_VALUE, message)


def check_options(options: list[str], headers: list[str] = ()) -> list[str]:
    """The options, unchanged, if every one is allowed; else CUDA_ERROR_INVALID_VALUE
    naming the first that is not. ``headers``: the names the guest sent with the source
    (the only files --pre-include may name)."""
    if len(options) > MAX_OPTIONS:
        _refuse(f"{len(options)} NVRTC options; at most {MAX_OPTIONS}")
    for opt in options:
        if len(opt) > MAX_OPTION_LEN or "\0" in opt:
            _refuse(f"NVRTC option of {len(opt)} characters refused")
        name, eq, value = opt.partition("=")
        if opt in _FLAGS or _DEFINE.fullmatch(opt) or _UNDEFINE.fullmatch(opt):
            continue
        spellings = next((k for k in _VALUED if name in k), None)
        if spellings is not None and eq and re.fullmatch(_VALUED[spellings], value):
            continue
        if name in _PRE_INCLUDE and eq and value in headers:
            continue
        if name in _PRE_INCLUDE or any(opt == f or opt.startswith((f + "=", f + " "))
                                       or (f == "-I" and opt.startswith("-I"))
                                       for f in _NAMES_FILES):
            _refuse(f"NVRTC option {opt!r} is refused: it names a host file or directory "
                    "(send headers with the source instead)")
        if spellings is not None:
            _refuse(f"NVRTC option {opt!r} is refused: the value is not one hvgpu allows")
        _refuse(f"NVRTC option {opt!r} is refused: not on hvgpu's list of allowed options "
                "(architecture, -std, -D/-U, debug and line info, fast-math family, -rdc, "
                "-default-device, diagnostics, ...)")
    return list(options)


def check_program_name(name: str) -> str:
    """A plain file name (NVRTC resolves quoted includes next to it); empty: the default."""
    if not name:
        return "hvgpu_program.cu"
    if not _NAME.fullmatch(name):
        _refuse(f"program name {name!r} is refused: use letters, digits and . _ + - "
                "(no directories)")
    return name


def check_header_names(names: list[str]) -> None:
    if len(names) > MAX_HEADERS:
        _refuse(f"{len(names)} headers; at most {MAX_HEADERS}")
    if len(set(names)) != len(names):
        _refuse("a header name is given twice")
    for name in names:
        if len(name) > 255 or not _HEADER.fullmatch(name) or ".." in name.split("/"):
            _refuse(f"header name {name!r} is refused: a relative name without '..' "
                    "(letters, digits, . _ + - and /)")


# -- includes ---------------------------------------------------------------------
#
# The check must find every #include that NVRTC acts on, so it reads a source as
# NVRTC does. Measured with libnvrtc 13.0 (tests/security/test_nvrtc_includes.py
# asks the real one): a backslash joins two lines only when the newline follows
# it directly ("\\\n", "\\\r\n"), never across a space or a tab (as GCC does); a
# line ends at "\n" alone, and a "\r" before "#" is a space, so "\r#include" is a
# directive; a comment that holds a newline leaves the next token at the start
# of a line ("/*\n*/ #include" is a directive) yet may also carry a directive's
# operand ("#include /*\n*/ "x""); trigraphs ("??/" a backslash) are read under
# -std=c++03, 11 and 14, not under 17 and 20 (the default); raw strings from
# c++11 (a delimiter of 16 bytes at most); digit separators (1'2) from c++14.
# Sources are read byte for byte (latin-1), as NVRTC counts. What a guest may
# choose (-std) and what is unclear are all read: every source is read under
# each standard's rules, with comments taken as a space and as the newlines
# they hold, and with lines joined across trailing blanks as well; an include
# that any of those readings finds is checked. Reading more than NVRTC does can
# only refuse more.

_TRIGRAPHS = {"=": "#", "/": "\\", "'": "^", "(": "[", ")": "]", "!": "|", "<": "{",
              ">": "}", "-": "~"}
_TRIGRAPH = re.compile(r"\?\?([=/'()!<>-])")
_SPLICES = (re.compile(r"\\\r*\n"),  # NVRTC's
            re.compile(r"\\[ \t\f\v\r]*\n"))  # and across trailing blanks, as GCC
# (trigraphs, raw strings, digit separators) of c++03, c++11, c++14, c++17/20
_STANDARDS = ((True, False, False), (True, True, False), (True, True, True),
              (False, True, True))
_BLANK = "[ \t\f\v\r]"
_DIRECTIVE = re.compile(rf"^{_BLANK}*(?:#|%:){_BLANK}*(include_next|include|import|embed)\b"
                        rf"(.*)$", re.M)
_HAS_INCLUDE = re.compile(r"__has_include(?:_next)?\s*\(\s*([^)]*)\)?")
_OPERAND = re.compile(r'(<[^<>\n]+>|"[^"\n]+")')


def _lexer(raw: bool, separators: bool) -> re.Pattern:
    """Comments, raw strings (blanked), and what must be stepped over whole so that a
    quote or a slash inside it starts nothing: literals, and numbers with digit
    separators."""
    parts = [r"(?P<c>//[^\n]*|/\*(?:.*?\*/|.*\Z))"]
    if raw:
        parts.append(r'(?P<r>(?<![A-Za-z0-9_])(?:u8|u|U|L)?R"(?P<d>[^()\\ \t\v\f\n"]{0,16})'
                     r'\((?:.*?\)(?P=d)"|.*\Z))')
    if separators:
        # every pp-number is stepped over whole, with separators or without: one that
        # failed at its end for want of a quote was tried again from each of its digits
        parts.append(r"(?<![A-Za-z0-9_])\.?[0-9](?:[eEpP][+-]|[0-9A-Za-z_.])*"
                     r"(?:'[0-9A-Za-z_](?:[eEpP][+-]|[0-9A-Za-z_.])*)*")
    parts.append(r'"(?:[^"\\\n]|\\[^\n])*"?|\'(?:[^\'\\\n]|\\[^\n])*\'?')
    return re.compile("|".join(parts), re.S)


_LEXERS = {(raw, sep): _lexer(raw, sep) for _, raw, sep in _STANDARDS}


def _readings(source: str):
    """The source as NVRTC's preprocessor may see it, under each reading above."""
    texts = {}
    for trigraphs, raw, sep in _STANDARDS:
        text = _TRIGRAPH.sub(lambda m: _TRIGRAPHS[m.group(1)], source) if trigraphs else source
        for splice in _SPLICES:
            texts.setdefault(splice.sub("", text), set()).add((raw, sep))
    for text, lexers in texts.items():
        for raw, sep in sorted(lexers):
            yield from _blanked(text, _LEXERS[raw, sep])


def _blanked(text: str, lexer: re.Pattern):
    """``text`` with comments and raw strings blanked: as a space, then as the newlines
    they hold."""
    spaced, lined, at = [], [], 0
    for m in lexer.finditer(text):
        if m.start("c") < 0 and ("r" not in lexer.groupindex or m.start("r") < 0):
            continue  # a literal or a number, stepped over as it is
        spaced.append(text[at:m.start()])
        lined.append(text[at:m.start()])
        spaced.append(" ")
        lined.append("\n" * m.group().count("\n") or " ")
        at = m.end()
    spaced.append(text[at:])
    lined.append(text[at:])
    yield "".join(spaced)
    yield "".join(lined)


def _check_operand(text: str, where: str, headers: set[str]) -> None:
    m = _OPERAND.match(text.strip())
    if m is None:
        _refuse(f"{where}: #include of {text.strip()[:80]!r} is refused: name a header "
                "literally (\"name.h\" or <name.h>), not through a macro")
    target = m.group(1)[1:-1]
    if target in headers:
        return
    if target.startswith("/") or "\\" in target or ".." in target.split("/") \
            or not _HEADER.fullmatch(target):
        _refuse(f"{where}: #include {m.group(1)} is refused: only headers sent with the "
                "source and the CUDA toolkit's headers, by a relative name without '..'")


def check_includes(source: bytes, headers: dict[str, bytes], name: str) -> None:
    """Every include of the source and of its headers names a header the guest sent or a
    toolkit header by a plain relative name; CUDA_ERROR_INVALID_VALUE otherwise."""
    names = set(headers)
    for where, text in ((name, source), *headers.items()):
        text = bytes(text).decode("latin-1")  # one character a byte, as NVRTC reads
        for logical in _readings(text):
            for kind, operand in _DIRECTIVE.findall(logical):
                if kind == "embed":
                    _refuse(f"{where}: #embed is refused: send the data with the source")
                _check_operand(operand, where, names)
            for operand in _HAS_INCLUDE.findall(logical):
                _check_operand(operand, where, names)
