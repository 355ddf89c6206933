"""results: what is kept of a measurement and how it is shown.

    store   the JSONL store of Results (save, load, rewrite; the reference results)
    tables  format_table: a table of Results, one row each, as the notebooks print it
    charts  the ladder, memory, quality-vs-speed and models charts; images side by side
    profile_chart  fdh.profile's stages and kinds of work, one bar per pipeline
    text    how the course writes its numbers (seconds and their +-, speed-ups with their
            range, memory, PSNR)

Imports the layers below it (models, techniques, measure), nothing of course or runs.
"""
