"""Print the C flags setup.py's compile_args() builds (for the cross builds in .ci/arm and .ci/wheel).

Read from the source, not run: importing setup.py would run setup(). QRT_EXTRA_CFLAGS, a setting of
the host's own build, is left out.

    python .ci/setup_cflags.py [path/to/setup.py]
"""

import ast
import sys

path = sys.argv[1] if len(sys.argv) > 1 else "setup.py"
with open(path) as f:
    tree = ast.parse(f.read())
fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "compile_args")
lists = [n.value for n in ast.walk(fn) if isinstance(n, ast.Assign) and isinstance(n.value, ast.List)]
assert len(lists) == 1, f"{path}: compile_args() no longer builds one list literal: update .ci/setup_cflags.py"
print(" ".join(ast.literal_eval(lists[0])))
