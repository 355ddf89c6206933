"""compiletime: what compiling costs and what it leaves behind, above the measurements.

    bundle          max-autotune's tuning as data, its format: the stamp, reading and
                    checking a bundle, merging timings, where the course keeps it, which
                    other GPU kind of one design may take it (same SMs and capability)
    bundle_cache    an inductor cache folder's tuning read and added to, and a GPU slot's
                    by-hand fallback (a tarball of the cache's tuning) imported
    bundle_io       a bundle exported, imported (what it covers registered for the autotune
                    rule, course/planning/tuning_state.py), every matching one imported, shown
    watch           a command that tunes keeps its tuning: the bundle and a progress file
                    written as they grow, when cut and when stopped, through the hooks it
                    puts into torch (choices made, coordinate descent followed, a
                    provisional best config told from a finished one)
    tuning_cpu      max-autotune's tuning on a CPU in a new process (06's experiment)
    cold_start      compile artifacts carried to another process or machine, and the time a
                    new process takes to its first compiled image

The course's decisions about a compile are planning's: where the kernels go
(course/planning/compile_cache.py) and whether a compile may tune (course/planning/autotune.py).
What a notebook compiles and the wait it means (the course clock) is planning's
(course/planning/clock.py). Imports the models, the techniques and the measurements (planning, below
it, it may import too), nothing of results, course or runs.
"""
