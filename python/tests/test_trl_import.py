"""reshard.trl where TRL is not installed: importing it is one ImportError
line saying what to install, and nothing else of the package depends on it
(import reshard and reshard.vllm_plugin still work). The plug-in itself runs
against real TRL in tests/trl (the 28-trl stage)."""

import importlib.util
import subprocess
import sys

import pytest


@pytest.mark.skipif(importlib.util.find_spec("trl") is not None, reason="TRL is installed here: tests/trl covers it")
def test_import_without_trl_names_what_to_install():
    code = ("import reshard, reshard.vllm_plugin\n"
            "try:\n"
            "    import reshard.trl\n"
            "except ImportError as e:\n"
            "    print('ImportError:', e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1, r.stdout
    assert lines[0].startswith("ImportError: reshard.trl needs TRL 1.16.0 in this Python environment "
                               "(pip install trl==1.16.0): No module named 'trl'"), lines[0]
