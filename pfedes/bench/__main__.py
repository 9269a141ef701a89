"""`python -m pfedes.bench`: the same as `pfedes-bench`."""

from . import main

main()
