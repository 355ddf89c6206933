"""course: what serves the notebooks.

    settings          the parameters cell (smoke mode, fdh.course_settings), GPU-only cells
    reference         the reference numbers a notebook quotes: the blog's published row and
                      every ladder committed under results/, with each rung's TF32 and VAE
    day               the day's result: the rungs the core lessons kept (fdh.keep_rung) and
                      one chart of them at the end of the last (fdh.day_chart)
    weights           the weights a parameters cell chose on a GPU, carried to later notebooks
    written_for       the library versions the course's code was written for
    playground        fdh.playground(): the ipywidgets panel to try recipes and compare runs
    playground_parts  the playground's controls, phases and small formatters
    lessons           the course as a workshop day: each notebook's track, visible words and
                      minutes, the core path (README's syllabus, `lessons --write`)
    lesson_plan       what a lesson waits for on an H100 and a T4, and what it downloads
    hosted            what every notebook's first cell runs where the course is not installed
                      (Colab, Kaggle, any Jupyter): the host's limits, the install with the
                      host's torch and Jupyter held, whether to restart; the cell itself
    opening           how a notebook opens where a participant is: its first cell, the GPU
                      Colab gives it, its Open-in-Colab and Open-in-Kaggle badges
    nbclean           git's clean filter for the notebooks (committed without outputs, which
                      the files keep) and `make lab`'s post-save hook

The course sized for the card (card_fit, rung_verdict) is planning's (planning/sizing.py).
Imports the layers below it (models to results), nothing of runs.
"""
