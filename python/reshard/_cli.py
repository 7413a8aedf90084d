"""The `reshard` console command of the Python package: runs the CLI built
and installed with it (reshard/bin/reshard, the same program as the
repository's build/reshard), with the same arguments, exit status and output."""

import os
import sys


def binary() -> str:
    """Path of the bundled CLI."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "reshard")


def main() -> None:
    path = binary()
    if not os.access(path, os.X_OK):
        sys.exit(f"reshard: the CLI is missing from this installation ({path}); reinstall the package "
                 "(pip install ./python)")
    os.execv(path, [path] + sys.argv[1:])


if __name__ == "__main__":
    main()
