"""reshard.vllm's kernel tables against docs/kernels.md, read from the source
(reshard.vllm imports vLLM, which this venv does not hold): a kernel is
proven, refused, or neither (then refused naming docs/kernels.md), never
two of them; every kernel the tables name has a row in docs/kernels.md whose
status says the same; an engine-formatted kernel is proven or refused."""

import ast
import os
import re

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def _tables():
    """{table name: {key: value node}} of the module-level dict literals of reshard/vllm.py."""
    with open(os.path.join(ROOT, "python", "reshard", "vllm.py")) as f:
        tree = ast.parse(f.read())
    out = {}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        value = getattr(node, "value", None)
        if isinstance(target, ast.Name) and isinstance(value, ast.Dict):
            out[target.id] = {ast.literal_eval(k): v for k, v in zip(value.keys, value.values)}
    return out


def _proven():
    return {c for v in _tables()["PROVEN_KERNELS"].values() for c in ast.literal_eval(v)}


def _doc_rows():
    """{kernel class: its status cell} of docs/kernels.md's table of kernels."""
    with open(os.path.join(ROOT, "docs", "kernels.md")) as f:
        text = f.read()
    section = text[text.index("## The kernels"):text.index("## What is proven where")]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0] and not cells[0].startswith("---"):
            for cls in re.findall(r"`([A-Za-z0-9]+)`", cells[0]):
                rows[cls] = cells[3]
    return rows


def test_a_kernel_is_proven_or_refused_never_both():
    t = _tables()
    proven, refused = _proven(), set(t["REFUSED_KERNELS"])
    assert not proven & refused, sorted(proven & refused)
    for cls in t["ENGINE_FORMATTED"]:
        assert cls in proven or cls in refused, f"{cls} is engine-formatted but neither proven nor refused"


def test_every_kernel_the_tables_name_has_a_row_that_says_the_same():
    t, rows = _tables(), _doc_rows()
    for cls in sorted(_proven()):
        assert cls in rows, f"{cls} is proven in reshard.vllm and has no row in docs/kernels.md"
        assert "proven on CPU" in rows[cls], f"{cls}: docs/kernels.md says {rows[cls]!r}"
    for cls in sorted(set(t["REFUSED_KERNELS"]) & set(rows)):
        assert "proven on CPU" not in rows[cls], f"{cls} is refused and docs/kernels.md says {rows[cls]!r}"
    gpu = {cls for cls, v in t["REFUSED_KERNELS"].items() if "_GPU_RUN" in ast.dump(v)}
    for cls in sorted(gpu):
        assert "waits for a GPU run" in rows.get(cls, ""), \
            f"{cls} waits for a GPU run and docs/kernels.md says {rows.get(cls)!r}"
    for cls in sorted(t["ENGINE_FORMATTED"]):
        if cls in _proven():
            assert "engine-formatted" in rows[cls], f"{cls}: docs/kernels.md says {rows[cls]!r}"


def test_the_docs_table_parses():
    rows = _doc_rows()
    assert {"TritonExperts", "DeepGemmFp8BlockScaledMMKernel", "FlashInferExperts"} <= set(rows), sorted(rows)
