"""Loaded at interpreter start by every process the documentation test runs (it is on their
PYTHONPATH): where a documented block names ``OpenAIChatModel``, ``ScriptedModel`` answers
instead, so the blocks run as written without a provider. Nothing else is replaced."""

from tests.support.doc_models import install

install()
