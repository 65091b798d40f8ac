"""`python -m reinforge ...`: the `reinforge` command, for when the script is not on PATH."""

from reinforge.cli import app

app(prog_name="reinforge")
