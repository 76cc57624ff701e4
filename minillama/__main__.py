"""Run the command line tool: python -m minillama ..."""

from minillama.cli import run

run()
