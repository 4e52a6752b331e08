"""Print the README's troubleshooting table from the bad-input corpus (test_bad_inputs.CASES):
each case run through the real CLI, with the line it printed and its exit code. Not a test;
it keeps the README's table what the code actually says.

    cd tests && python bad_input_table.py > /tmp/table.md
"""

import contextlib
import io
import tempfile
from pathlib import Path

from test_bad_inputs import CASES

from turbogs.cli import main


def run_case(build) -> tuple:
    with tempfile.TemporaryDirectory() as tmp:
        args, _ = build(Path(tmp))
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main([str(a) for a in args])
        return code, err.getvalue().strip().replace(tmp, "…").replace("`", "'")


def main_table() -> None:
    print("| case | what you see (stderr) | exit |")
    print("|---|---|---:|")
    for name in sorted(CASES):
        code, line = run_case(CASES[name])
        print(f"| {name} | `{line}` | {code} |")


if __name__ == "__main__":
    main_table()
