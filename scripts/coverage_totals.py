#!/usr/bin/env python3
"""Print line and branch coverage from coverage.py's JSON report (make coverage).

scripts/coverage_totals.py .coverage-data/all.json
"""

import json
import sys

with open(sys.argv[1], encoding="utf-8") as report:
    totals = json.load(report)["totals"]
lines = totals["covered_lines"] / totals["num_statements"]
branches = totals["covered_branches"] / totals["num_branches"]
print(
    f"coverage: lines {lines:.2%} ({totals['covered_lines']}/{totals['num_statements']}),"
    f" branches {branches:.2%} ({totals['covered_branches']}/{totals['num_branches']})"
)
