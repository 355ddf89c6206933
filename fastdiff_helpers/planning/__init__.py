"""planning: what a card will do with the course, estimated before anything runs.

    published   the published and measured figures the estimates rest on (source, the figure
                as written, settings), and the published peak memory
    image_time  fdh.image_seconds: one image's seconds on a card, per ladder step, from them

Imports the models, the techniques and the measurements, nothing of compiletime, results,
course or runs (the course clock, compiletime/clock.py, asks image_time for its images).
"""
