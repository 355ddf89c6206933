"""compiletime: what compiling costs and what it leaves behind, above the measurements.

    tuning          max-autotune's tuning as data: a bundle exported, imported (what it
                    covers registered for the autotune rule, techniques/autotune.py), shown
    tuning_data     the bundle's format: its stamp, reading and checking it, merging timings
    tuning_cache    adding tuning to a cache folder; what this process imported, by model
    tuning_raw      a GPU slot's by-hand fallback (a tarball of the cache's tuning), imported
    tuning_kinds    tuning seeded across GPU kinds of one design (same SMs and capability)
    tuning_watch    a command that tunes keeps its tuning: the bundle and a progress file
                    written as they grow, when cut and when stopped
    tuning_hooks    the hooks a watch puts into torch (choices made, coordinate descent
                    followed, a provisional best config told from a finished one)
    tuning_cpu      max-autotune's tuning on a CPU in a new process (06's experiment)
    cold_start      compile artifacts carried to another process or machine, and the time a
                    new process takes to its first compiled image

The compile path's own part lives with the compile technique: where the kernels go
(techniques/compile_cache.py) and whether a compile may tune (techniques/autotune.py). What a
notebook compiles and the wait it means (the course clock) is planning's (planning/clock.py).
Imports the models, the techniques and the measurements (planning, below it, it may import
too), nothing of results, course or runs.
"""
