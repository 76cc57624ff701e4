"""Run the command line tool: python -m minillama ..."""

import sys

from minillama.cli import main

sys.exit(main())
