"""The verbs' work, one module per verb (the data verbs share one): `kiln.cli` parses the
command line, dispatches here, and turns errors into one line and an exit status."""
