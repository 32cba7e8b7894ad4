"""Shared by the benches: repeated runs, medians with min-max, and JSON results under ``work/bench/``.

Every bench records each figure as the list of its runs; the JSON file (one
per bench, ``work/bench/<bench>.json``) keeps the runs, the median and the
spread, and ``bench/report.py`` turns those files into the tables in
``README.md`` and ``docs/*.md``.  Goals are checked on medians (of per-run
ratios where a goal is a ratio of two figures measured side by side in the
same repeat) and printed as met / not met.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "work" / "bench"


def spread(runs: Sequence[float]) -> Dict[str, Any]:
    """``{"runs", "median", "min", "max"}`` of the finite values in ``runs``."""
    vals = [float(v) for v in runs if v is not None and v == v]
    if not vals:
        return {"runs": [], "median": None, "min": None, "max": None}
    return {"runs": vals, "median": statistics.median(vals), "min": min(vals), "max": max(vals)}


def ratios(num: Sequence[float], den: Sequence[float]) -> List[float]:
    """Per-repeat ratios ``num[i] / den[i]`` (both measured in the same repeat)."""
    return [a / b for a, b in zip(num, den) if a is not None and b]


def fmt(value: Optional[float], digits: int = 2) -> str:
    if value is None:
        return "n/a"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def fmt_spread(s: Dict[str, Any], digits: int = 2) -> str:
    """``"5.94 (5.10-6.20)"``: median and min-max."""
    if s.get("median") is None:
        return "n/a"
    if s.get("basis"):
        return f"{fmt(s['median'], digits)} ({s['basis']})"
    if len(s["runs"]) == 1:
        return f"{fmt(s['median'], digits)} (1 run)"
    return f"{fmt(s['median'], digits)} ({fmt(s['min'], digits)}-{fmt(s['max'], digits)})"


class Results:
    """The figures and goals of one bench run; :meth:`write` saves them as JSON."""

    def __init__(self, bench: str, params: Dict[str, Any], title: str = "") -> None:
        self.bench = bench
        self.title = title
        self.params = params
        self.figures: List[Dict[str, Any]] = []
        self.goals: List[Dict[str, Any]] = []
        self.notes: List[str] = []
        self.started = time.strftime("%Y-%m-%dT%H:%M:%S%z")

    def add(self, name: str, runs: Sequence[float], unit: str, note: str = "", digits: int = 2) -> Dict[str, Any]:
        fig = {"name": name, "unit": unit, "note": note, "digits": digits, **spread(runs)}
        self.figures.append(fig)
        return fig

    def goal(self, name: str, runs: Sequence[float], goal: str, met: Optional[bool], note: str = "",
             digits: int = 2, basis: str = "") -> Dict[str, Any]:
        """A goal checked on the median of ``runs``; ``met`` None = could not be measured.

        ``basis`` says how a single derived value was computed (e.g. "ratio of the medians").
        """
        g = {"name": name, "goal": goal, "met": met, "note": note, "digits": digits, "basis": basis,
             **spread(runs)}
        self.goals.append(g)
        status = "n/a" if met is None else ("met" if met else "NOT met")
        print(f"goal: {name} = {fmt_spread(g, digits)} (goal {goal}): {status}" + (f"  [{note}]" if note else ""),
              flush=True)
        return g

    def note(self, text: str) -> None:
        self.notes.append(text)

    def write(self) -> Path:
        RESULTS.mkdir(parents=True, exist_ok=True)
        path = RESULTS / f"{self.bench}.json"
        doc = {"bench": self.bench, "title": self.title, "command": _command(), "started": self.started,
               "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": machine(), "params": self.params,
               "figures": self.figures, "goals": self.goals, "notes": self.notes}
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
        os.replace(tmp, path)
        print(f"results: {_rel(path)}", flush=True)
        return path


def met_at_least(runs: Sequence[float], goal: float) -> Optional[bool]:
    s = spread(runs)
    return None if s["median"] is None else s["median"] >= goal


def met_at_most(runs: Sequence[float], goal: float) -> Optional[bool]:
    s = spread(runs)
    return None if s["median"] is None else s["median"] <= goal


def machine() -> Dict[str, Any]:
    info: Dict[str, Any] = {"cpus": os.cpu_count(), "python": platform.python_version(),
                            "platform": platform.platform(terse=True)}
    try:
        info["load_avg_1m"] = round(os.getloadavg()[0], 2)
    except OSError:
        pass
    try:
        with open("/proc/meminfo") as f:
            info["mem_gib"] = round(int(f.readline().split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    return info


def _rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def _command() -> str:
    script = Path(sys.argv[0])
    try:
        script = script.resolve().relative_to(REPO)
    except ValueError:
        pass
    return " ".join(["python", str(script), *sys.argv[1:]])
