"""The pure core loads no store: the mode table, the prompts and the rewards import without SQLAlchemy (the
samplers bound to the modes live one floor down, in lanpo.feedback.draw)."""

from __future__ import annotations

import subprocess
import sys


def test_the_mode_table_and_the_rewards_load_no_sqlalchemy() -> None:
    code = (
        "import sys, lanpo.rewards, lanpo.feedback_modes, lanpo.prompts; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'sqlalchemy'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
