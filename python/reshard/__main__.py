"""`python -m reshard ...`: the reshard CLI, as the `reshard` console command runs it."""

from ._cli import main

main()
