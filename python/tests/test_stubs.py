"""The type stubs shipped with the package (reshard/_reshard.pyi) are what
nanobind's stubgen writes for the built extension: a signature changed in
C++ without the stub fails here. Regenerate with
    python -m nanobind.stubgen -m reshard._reshard -P -o python/reshard/_reshard.pyi
and write `_have_cuda: bool` without the build's value (CPU and CUDA builds share the stub).
"""

import os
import re
import subprocess
import sys

import pytest

import reshard


def test_stubs_match_the_extension(tmp_path):
    pytest.importorskip("nanobind.stubgen")
    out = tmp_path / "_reshard.pyi"
    r = subprocess.run([sys.executable, "-m", "nanobind.stubgen", "-m", "reshard._reshard", "-P", "-q", "-o", str(out)], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    shipped = os.path.join(os.path.dirname(reshard.__file__), "_reshard.pyi")
    with open(shipped) as f, open(out) as g:
        made = re.sub(r"(?m)^_have_cuda: bool = (True|False)$", "_have_cuda: bool", g.read())
        assert f.read() == made, ("python/reshard/_reshard.pyi differs from the extension's signatures: "
                                      "regenerate it (this file's docstring)")
