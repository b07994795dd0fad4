"""What the judging and table tools under tools/ do with a report once it is written: print it,
save it, and say with the exit code whether a row failed."""

from __future__ import annotations

import json

__all__ = ["finish", "save_text"]


def save_text(text: str, out: str | None) -> None:
    """Print ``text`` and, with ``out``, write it to that file too."""
    if out:
        with open(out, "w") as f:
            f.write(text)
    print(text, end="")


def finish(text: str, out: str | None, env: dict, rows: list[dict]) -> int:
    """Print a judging tool's report; with ``out``, write ``out``.txt (the text) and ``out``.json
    (``env`` and ``rows``). Exit code 1 when a row's outcome is FAIL, else 0."""
    save_text(text, None if out is None else out + ".txt")
    if out:
        with open(out + ".json", "w") as f:
            json.dump(dict(env=env, rows=rows), f, indent=1, default=str)
    return 1 if any(r["outcome"] == "FAIL" for r in rows) else 0
