"""Everything that crosses Redis or the broker, apart from storage: a turn's fenced stream
(``streams``), the drain nudges and follow-up messages (``dispatch``), revocation flags
(``flags``), the wake-ups of waiting callers (``wakeups``), worker presence records
(``presence``) and the clients they use (``clients``). Every key comes from
``think_jobs.keys``.
"""
