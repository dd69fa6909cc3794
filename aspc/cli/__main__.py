"""``python -m aspc.cli`` runs the command line (used by subprocess tests)."""

from aspc.cli import main

main(prog_name="aspc")
