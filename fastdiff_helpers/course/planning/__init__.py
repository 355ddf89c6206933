"""planning: the course's ladders, and what a card will do with them, estimated before
anything runs.

    gpus              the GPUs workshops get, as data (fdh.course.gpu_profile): memory, SMs,
                      compute capability, what each can do; whether a model fits one (fits,
                      from the estimated peak, fdh.course.peak_bytes)
    ladders           the course's ladders of recipes: the blog's LADDER, the COURSE_LADDER,
                      the FLUX_LADDER (LADDERS holds the three)
    writes            what the course's runs write: a run's own folder, a file written whole
    compile_cache     the course's one folder for compiled kernels and graphs
                      (fdh.course.use_course_cache)
    autotune          whether a compile may tune on a GPU: the course's decision, passed to
                      fdh.apply as tuning= (the switch, the gate, the default-mode
                      equivalent, the estimate said before compiling)
    tuning_state      this process's tuning state in one object (STATE, one reset): the
                      switch, what imported bundles cover and brought, the active watches
    coordesc          coordinate descent's mark kept through the compile worker's pickle
    published         the published and measured figures the estimates rest on (source, the
                      figure as written, settings), and the published peak memory
    shapes            the GEMM shapes max-autotune benchmarks (fdh.course.gemm_shapes), on
                      meta copies
    image_time        fdh.course.image_seconds: one image's seconds on a card, per ladder step,
                      from them
    clock             the course clock: what each notebook compiles and runs on a GPU, and the
                      estimated wait (`python -m fastdiff_helpers clock`)
    clock_record      what each notebook's smoke run did, cell by cell (written by clock)
    recorder          the clock's recorder: it listens to the core's events in a smoke run
    clock_gpu         what the cells that do more on a GPU than in smoke mode do there
    sizing            the course sized for the card: size, runs and batch that fit, and each
                      recipe's verdict (runs, swapped, skipped) with its reason (card_fit,
                      rung_verdict)
    course_downloads  what each notebook downloads, from the clock's record
                      (course_downloads), and what of it a card needs (for_card)
    plan              `plan --gpu`: per notebook, on a card, what runs, is swapped or skipped,
                      memory fit and the estimated wait (fdh.course.plan_table, plan_summary),
                      from what of each cell's recorded work runs on that card (card_work)

The one public way to ask what a cell or a notebook does:
    clock.cell_work(notebook)             [(cell, work)] as an H100 runs it: the smoke record,
                                          the GPU cells' declared work in place
    plan.card_work(profile, notebook)     the same on a card, less what the card skips
    plan.plan(profile) / fdh.course.plan_table(gpu)  per notebook: verdict, fit and estimated wait
Other subpackages ask these, never a planning module's private names.

Imports the models, the techniques and the measurements, nothing of compiletime, results,
course or runs (the course and the command line import planning).
"""
