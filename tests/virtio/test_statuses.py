"""One error table: every status the code uses is named in protocol.STATUSES, and
no code, Python or C, spells a status as a bare number."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from hvgpu.virtio import protocol as P

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sorted((ROOT / "hvgpu").rglob("*.py")) + [ROOT / "tests" / "fake_gpu.py"]
C_SOURCES = sorted((ROOT / "hvgpu" / "guest" / "shim").glob("*.[ch]")) + \
    [ROOT / "hvgpu" / "host" / "executor" / "launch_burst.c"]
ERRORS = {"CudaError", "CompileError"}


def test_every_status_in_the_table_has_a_constant_of_its_name():
    for code, (name, text) in P.STATUSES.items():
        assert getattr(P, name, None) == code, name
        assert text and name.startswith(("CUDA_", "HVGPU_ERROR_")), name
    assert len(P.STATUS_BY_NAME) == len(P.STATUSES)
    assert P.STICKY_STATUSES <= set(P.STATUSES)
    assert all(code >= P.HV_STATUS_BASE for code, (name, _) in P.STATUSES.items()
               if name.startswith("HVGPU_"))


def _numeric(node) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int


def _statusish(node) -> bool:
    name = node.attr if isinstance(node, ast.Attribute) else \
        node.id if isinstance(node, ast.Name) else ""
    return "status" in name.lower()


def python_literals(source: str) -> list[tuple[int, str]]:
    """(line, what) for each status spelt as a number: the first argument of a
    CudaError, a status= keyword, a "status" dict entry, or a comparison with a
    name that holds a status (0, success, is allowed in comparisons)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            callee = node.func.attr if isinstance(node.func, ast.Attribute) else \
                getattr(node.func, "id", "")
            if callee in ERRORS and node.args and _numeric(node.args[0]):
                found.append((node.lineno, f"{callee}({node.args[0].value}, ...)"))
            for kw in node.keywords:
                if kw.arg == "status" and _numeric(kw.value) and kw.value.value:
                    found.append((node.lineno, f"status={kw.value.value}"))
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if isinstance(key, ast.Constant) and key.value == "status" and \
                        _numeric(value) and value.value:
                    found.append((node.lineno, f'"status": {value.value}'))
        elif isinstance(node, ast.Compare) and (_statusish(node.left) or
                                                any(map(_statusish, node.comparators))):
            for side in [node.left, *node.comparators]:
                if _numeric(side) and side.value:
                    found.append((node.lineno, f"status compared with {side.value}"))
    return found


def test_the_python_scan_finds_numeric_statuses():
    source = ("raise CudaError(101, 'x')\nCompileError(300)\nf(status=10006)\n"
              "m = {'status': 2}\nif exc.status == 801: pass\n"
              "raise CudaError(P.CUDA_ERROR_INVALID_DEVICE, 'x')\nif status == 0: pass\n")
    assert [line for line, _ in python_literals(source)] == [1, 2, 3, 4, 5]


def test_no_python_code_spells_a_status_as_a_number():
    found = [f"{path.relative_to(ROOT)}:{line}: {what}" for path in PYTHON
             for line, what in python_literals(path.read_text())]
    assert not found, "name these statuses (hvgpu.virtio.protocol):\n" + "\n".join(found)


_C_FUNCTION = re.compile(r"^(?:static\s+|HV_EXPORT\s+|inline\s+)*(CUresult|int)\s+\**(\w+)"
                         r"\s*\([^;{]*\)\s*\{(.*?)^\}", re.M | re.S)
_C_RESULT = re.compile(r"(?:\breturn\s+|\b(?:CUresult\s+\w+|\*?r|\*?status|rc|res|result)"
                       r"\s*=\s*)\(?(-?\d+)\)?\s*;")


def c_literals(source: str) -> list[str]:
    """Numeric statuses in C: a CUresult function returning a nonzero number, or a
    nonzero number stored as a result anywhere."""
    found = []
    for match in _C_FUNCTION.finditer(source):
        kind, name, body = match.groups()
        for value in re.findall(r"\breturn\s+\(?(-?\d+)\)?\s*;", body):
            if kind == "CUresult" and int(value):
                found.append(f"{name}: return {value}")
    for value in _C_RESULT.findall(re.sub(r"\breturn\s+\(?-?\d+\)?\s*;", "", source)):
        if int(value) not in (0, 1, -1):  # flags and counts share these names
            found.append(f"= {value}")
    found += [f"CUresult {v}" for v in re.findall(r"\(CUresult\)\s*(\d+)", source) if int(v)]
    return found


def test_the_c_scan_finds_numeric_statuses():
    source = ("static CUresult f(int a) {\n    if (a) return 901;\n    return 0;\n}\n"
              "int g(void) {\n    return 5;\n}\n"
              "static void h(CUresult *r) {\n    *r = 999;\n}\n")
    assert c_literals(source) == ["f: return 901", "= 999"]


def test_no_c_code_spells_a_status_as_a_number():
    found = [f"{path.relative_to(ROOT)}: {what}" for path in C_SOURCES
             for what in c_literals(path.read_text())]
    assert not found, "use the generated header's names:\n" + "\n".join(found)


def test_every_status_the_c_code_names_is_in_the_table():
    used = set()
    for path in C_SOURCES:
        text = path.read_text()
        used |= set(re.findall(r"\b(CUDA_(?:SUCCESS|ERROR_[A-Z0-9_]+))\b", text))
        used |= {m for m in re.findall(r"\bHVGPU_STATUS_([A-Z0-9_]+)\b", text)
                 if m != "OWN_BASE"}
    assert used, "the scan found no statuses at all"
    unnamed = sorted(used - set(P.STATUS_BY_NAME))
    assert not unnamed, f"statuses the C code returns without a name in STATUSES: {unnamed}"
