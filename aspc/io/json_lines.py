"""Whether pyarrow.json reads a JSON-lines file as the row reader's json.loads does, line for line.

pyarrow.json is more lenient than json.loads: it reads two objects on one line and one object over two
lines, a top-level ``null``, ``Inf``, ``-Inf`` and ``-NaN``, and nests without limit (json.loads fails
past ~1,000 levels). A bulk reader that took such a file compiled what the row reader refuses, or took
rows from the wrong lines. A byte scan (:mod:`aspc.io.json_lines_kernel`) rules each of them out; where
it answers no, the file is read row by row, which words the error.
"""

from __future__ import annotations

import numpy as np

from aspc.io.json_lines_kernel import one_object_a_line

__all__ = ["MAX_DEPTH", "read_alike"]

# Deeper goes row by row: json.loads raises RecursionError somewhere under sys.getrecursionlimit()
# (1,000), less the frames already on the stack.
MAX_DEPTH = 100


def read_alike(data: bytes) -> bool:
    """Whether every line of ``data`` (UTF-8, no BOM) that is not JSON whitespace holds exactly one object, at
    most :data:`MAX_DEPTH` deep, with no number literal json.loads refuses. Conservative: only the lines
    pyarrow parses need a right answer."""
    return bool(one_object_a_line(np.frombuffer(data, dtype=np.uint8), MAX_DEPTH))
