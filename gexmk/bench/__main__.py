"""``python -m gexmk.bench``: see the package docstring."""
import sys

from gexmk.bench.driver import main

sys.exit(main())
