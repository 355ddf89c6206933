"""results: what is kept of a measurement and how it is shown.

    store   the JSONL store of Results (save, load; a run's folder of records and images)
    tables  format_table: a table of Results, one row each, as the notebooks print it
    charts  the ladder, memory, quality-vs-speed and models charts; images side by side;
            fdh.profile's stages and kinds of work, one bar per pipeline (profile_chart)
    playground  fdh.playground(): the ipywidgets panel to try recipes and compare runs;
            the course's settings (fdh.course.settings) are its one hook
How the numbers are written (seconds, memory, PSNR) is the Result's own: measure/record.py.

Imports the layers below it (models, techniques, measure), nothing of course or runs.
"""
