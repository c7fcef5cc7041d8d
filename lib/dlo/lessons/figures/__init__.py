"""Pictures of the course's concepts, drawn by code from the library's own structures and simulators.

One module per topic (``dlo.lessons.figures.<topic>``); each function returns a matplotlib Figure drawn from the
same data the matching exercise uses (a schedule from the pipeline simulator, a Grid's groups, the TP layers'
shapes, ...), so that the picture and the exercise cannot disagree: each module's test compares the drawn data
with the exercise's. The drawing primitives shared by every topic are in :mod:`dlo.lessons.figures.style`.
"""
