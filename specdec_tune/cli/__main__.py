"""``python -m specdec_tune.cli``: the same entry point as the ``specdec-tune`` console script."""
from specdec_tune.cli import main

main()
