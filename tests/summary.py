#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Prints one closing line over every test report make test wrote: GoogleTest JSON and pytest JUnit XML.

Usage: summary.py REPORT...   Exits non-zero if any test failed or was skipped, or a report is missing.
A skipped test is not a pass: on the machine make test runs on, every test can run.
"""
import json
import sys
import xml.etree.ElementTree as ET


def gtest_counts(path):
    with open(path) as f:
        report = json.load(f)
    passed = failed = skipped = 0
    for suite in report.get("testsuites", []):
        for case in suite.get("testsuite", []):
            if case.get("result") == "SKIPPED" or case.get("status") == "NOTRUN":
                skipped += 1
            elif case.get("failures"):
                failed += 1
            else:
                passed += 1
    return passed, failed, skipped


def junit_counts(path):
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    tests = failed = skipped = 0
    for s in suites:
        tests += int(s.get("tests", 0))
        failed += int(s.get("failures", 0)) + int(s.get("errors", 0))
        skipped += int(s.get("skipped", 0))
    return tests - failed - skipped, failed, skipped


def main(paths):
    total = [0, 0, 0]
    for path in paths:
        try:
            counts = gtest_counts(path) if path.endswith(".json") else junit_counts(path)
        except (OSError, ValueError, ET.ParseError) as e:
            print(f"summary: cannot read {path}: {e}", file=sys.stderr)
            return 1
        print(f"  {path}: {counts[0]} passed, {counts[1]} failed, {counts[2]} skipped")
        total = [a + b for a, b in zip(total, counts)]
    print(f"mergewatch: {total[0]} passed, {total[1]} failed, {total[2]} skipped")
    if total[2]:
        print(f"summary: {total[2]} skipped test(s): a skip is not a pass (see the reports above)", file=sys.stderr)
    return 1 if total[1] or total[2] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
