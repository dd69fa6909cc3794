"""``targets_sha256``: a digest in metadata.json binding a predictor's target names, in order, to its weights.

The names are outside the weights' hash (``weights_sha256``, the identity a plan records), so swapping two
names in metadata.json answered ``--target beta`` with alpha's head under the unedited identity. Adding the
names to that hash would change the hash of every predictor directory written so far (their hash checks would
then fail); a separate field leaves them alone. A directory without it (older aspc, or no targets) loads as before.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aspc.errors import PredictorError

FIELD = "targets_sha256"


def targets_digest(weights_hash: str, targets: Sequence[str]) -> str:
    """sha256 of the weights' hash, a newline and the names as a JSON list (order matters: it picks the heads)."""
    return hashlib.sha256(f"{weights_hash}\n{json.dumps(list(targets))}".encode()).hexdigest()


def record_targets(body: dict[str, Any], weights_hash: str, targets: Sequence[str]) -> None:
    """Set the field in a metadata body about to be saved; drop it without targets (a stale copy would not fit)."""
    body.pop(FIELD, None)
    if targets:
        body[FIELD] = targets_digest(weights_hash, targets)


def check_targets(path: str | Path, meta: dict[str, Any], weights_hash: str, targets: Sequence[str]) -> None:
    """Refuse target names that differ from those recorded with the weights (checked only where recorded).

    A directory whose ``weights_sha256`` was removed (weights edited on purpose) skips this check too: the digest
    covers the weights' hash, so it would blame the names for the weights' edit.
    """
    if FIELD in meta and "weights_sha256" in meta and meta[FIELD] != targets_digest(weights_hash, targets):
        raise PredictorError(
            f"{path}: target names do not match their recorded hash (metadata.json targets edited); "
            "restore metadata.json or retrain it"
        )
