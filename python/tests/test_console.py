"""`pip install ./python` installs the `reshard` console command: the same
CLI as the repository's build/reshard (bundled as reshard/bin/reshard)."""

import json
import os
import subprocess
import sys

import reshard
from conftest import CLUSTER, reshard_binary


def _console():
    return os.path.join(os.path.dirname(sys.executable), "reshard")


def test_the_console_command_is_the_cli(plans):
    exe = _console()
    assert os.access(exe, os.X_OK), f"{exe}: not installed by pip install ./python"
    for args in (["validate", str(plans["tiny-dense"])], ["show", str(plans["tiny-moe"]), "--json"],
                 ["validate", "/nonexistent.rsplan"], ["--version"]):
        mine = subprocess.run([exe, *args], capture_output=True, text=True)
        ref = subprocess.run([str(reshard_binary()), *args], capture_output=True, text=True)
        assert (mine.returncode, mine.stdout, mine.stderr) == (ref.returncode, ref.stdout, ref.stderr), args
    assert subprocess.run([exe, "validate", str(plans["tiny-dense"])]).returncode == 0


def test_python_dash_m_reshard_is_the_cli(plans):
    for args in (["validate", str(plans["tiny-dense"])], ["validate", "/nonexistent.rsplan"], ["--version"]):
        mine = subprocess.run([sys.executable, "-m", "reshard", *args], capture_output=True, text=True)
        ref = subprocess.run([str(reshard_binary()), *args], capture_output=True, text=True)
        assert (mine.returncode, mine.stdout, mine.stderr) == (ref.returncode, ref.stdout, ref.stderr), args


def test_the_console_command_simulates(plans):
    # simulate loads the SimGrid replay from a module installed beside the CLI
    # (reshard/bin/libreshard_simgrid.so); its prediction is the build's.
    args = ["simulate", str(plans["tiny-dense"]), "--cluster", str(CLUSTER), "--json"]
    mine = subprocess.run([_console(), *args], capture_output=True, text=True)
    ref = subprocess.run([str(reshard_binary()), *args], capture_output=True, text=True)
    assert mine.returncode == 0 and ref.returncode == 0, mine.stderr + ref.stderr
    assert json.loads(mine.stdout)["predicted_seconds"] == json.loads(ref.stdout)["predicted_seconds"] > 0


def test_the_bundled_cli_sits_in_the_package():
    from reshard import _cli

    assert os.path.dirname(os.path.dirname(_cli.binary())) == os.path.dirname(reshard.__file__)
    r = subprocess.run([_cli.binary(), "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "compile" in r.stdout and "validate" in r.stdout
