"""`python -m fastdiff_helpers --help`: the course's command line, course/runs/cli.py."""

from .course.runs.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
