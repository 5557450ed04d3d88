"""`edgellm dev` freezes what startup made before it serves (`cli.out_of_the_collectors_way`):
startup's garbage is collected first, and what lives on is left out of every later collection."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import gc, json, logging, weakref
from edgellm_local.cli import out_of_the_collectors_way

class Node:
    pass

cycle = Node(); cycle.self = cycle; gone = weakref.ref(cycle); del cycle  # garbage only a collection frees
kept = Node()
frozen = out_of_the_collectors_way(logging.getLogger("probe"))
print(json.dumps({"garbage_freed": gone() is None, "frozen": frozen, "freeze_count": gc.get_freeze_count(),
                  "kept_walked": any(o is kept for o in gc.get_objects())}))
"""


def test_startup_garbage_is_collected_and_the_rest_frozen() -> None:
    # its own process: freezing is process-wide, and this one's objects must stay collectable
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, check=True)
    facts = json.loads(out.stdout.splitlines()[-1])
    assert facts["garbage_freed"], "startup garbage kept for ever"
    assert facts["frozen"] == facts["freeze_count"] > 1000
    assert not facts["kept_walked"], "a startup object is still walked by every collection"
