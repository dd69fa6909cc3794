"""``python -m aspc.cli`` runs the command line (used by subprocess tests and examples)."""

from aspc.entry import refuse_a_small_address_space

refuse_a_small_address_space()
from aspc.cli import main  # noqa: E402 - after the check: the command line loads the libraries it guards

main(prog_name="aspc")
