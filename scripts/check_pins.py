#!/usr/bin/env python3
"""Checks that the running interpreter's environment satisfies a pinned
requirements file (NAME==VERSION lines), from installed distributions' metadata
alone: fast enough to run on every install-deps.sh call.

  check_pins.py REQUIREMENTS      exit 0 when every pin holds, else 1 and the list
  check_pins.py --version-of NAME print the installed version of NAME (exit 1 if absent)
"""
import importlib.metadata as metadata
import re
import sys

PIN = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([^\s;#]+)")


def installed_version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def main(argv):
    if len(argv) == 3 and argv[1] == "--version-of":
        v = installed_version(argv[2])
        if v is None:
            return 1
        print(v)
        return 0
    if len(argv) != 2:
        print("usage: check_pins.py REQUIREMENTS | --version-of NAME", file=sys.stderr)
        return 2
    wrong = []
    with open(argv[1]) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            m = PIN.match(line)
            if not m:
                print(f"check_pins: {argv[1]}:{lineno}: not a NAME==VERSION pin: {line.strip()}", file=sys.stderr)
                return 2
            have = installed_version(m.group(1))
            if have != m.group(2):
                wrong.append(f"{m.group(1)}=={m.group(2)} (installed: {have or 'none'})")
    for w in wrong:
        print(f"check_pins: {argv[1]}: {w}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
