"""Shared by the CLI checks: collect failures, then report them and set the exit code."""
import signal
import subprocess
import sys

failures = []


def expect(cond, msg):
    if not cond:
        failures.append(msg)


def error_problems(r, must=(), code=2):
    """What breaks the bad-input contract in a finished subprocess.run: exit `code`, exactly one stderr line,
    starting with 'error: ' and holding every string of `must`."""
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    problems = []
    if r.returncode != code:
        problems.append(f"exit {r.returncode}, wanted {code}")
    if len(lines) != 1:
        problems.append(f"{len(lines)} stderr lines")
    elif not lines[0].startswith("error: "):
        problems.append("line does not start with 'error: '")
    problems += [f"missing {m!r}" for m in must if m not in r.stderr]
    return problems


def held_signal(cmd, sig, timeout=300):
    """Runs cmd with `sig` sent at once but held by a blocked mask that the process inherits, so that it arrives
    when the process unblocks it (memlab: as it sets up its stop handling, before a run's setup), never earlier.
    Returns the exit status and stderr."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_BLOCK, {sig}))
    p.send_signal(sig)
    _, err = p.communicate(timeout=timeout)
    return p.returncode, err


def finish(ok_message, limit=None):
    if failures:
        print(f"{len(failures)} failures" + (", first ones:" if limit and len(failures) > limit else ":"))
        for f in failures[:limit]:
            print("  " + f)
        sys.exit(1)
    print(ok_message)
