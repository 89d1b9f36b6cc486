"""Runnable examples of think-jobs (``examples.chat``: a ``useChat`` page against a live agent)."""
