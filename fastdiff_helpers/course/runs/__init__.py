"""runs: the long runs and the command line, the top layer.

    ladder            run_ladder: every step of a ladder on a fresh pipeline
    warm              warm_ladder: every compiled step of a ladder compiled ahead of time
    batch             run_batch: one image per prompt, over the processes of a launcher
    launch            launch_batch: `torchrun` for a notebook cell, the `batch` command
    demo              `make demo`: the blog's ladder (on a GPU without autotuning, the
                      course's) with the course's settings, said before and explained after
                      (each step, from what was measured)
    cli               `python -m fastdiff_helpers ...`: the command line over all of these,
                      the plan and download commands too
    cli_compile       its compile commands: warm (a part at a time), tuning, clock

Imports every layer below it; the course's settings too (the demo runs with them). The
reference run, this project's own GPU measurements, is tools/reference/, outside the package.
"""
