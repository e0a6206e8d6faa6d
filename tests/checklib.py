"""Shared by the CLI checks: collect failures, then report them and set the exit code."""
import sys

failures = []


def expect(cond, msg):
    if not cond:
        failures.append(msg)


def finish(ok_message, limit=None):
    if failures:
        print(f"{len(failures)} failures" + (", first ones:" if limit and len(failures) > limit else ":"))
        for f in failures[:limit]:
            print("  " + f)
        sys.exit(1)
    print(ok_message)
