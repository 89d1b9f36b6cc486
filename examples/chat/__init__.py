"""The ``useChat`` example: ``server.py`` is its think-jobs side, ``src/`` its React page."""
