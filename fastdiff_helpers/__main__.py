"""`python -m fastdiff_helpers ladder | bench | env`: see fastdiff_helpers/cli.py."""

from .course.runs.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
