"""Strategy inspection (no TensorFlow here): dumps a person can read.

``dumps`` writes and reads ``strategy-<k>/`` directories, ``schema`` holds their documented
JSON Schemas and a validator, ``trace`` turns a predicted or measured step into a Chrome trace,
``graphviz`` the placed graph into DOT, ``figures`` and ``report`` make ``report.html``,
``summary`` the text of ``fastt inspect``.
"""
