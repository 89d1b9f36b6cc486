"""Observability adapters: Prometheus metrics, OpenTelemetry traces, structured logs.

Independent of storage and transport: what they report about the database (queue depths) is
handed to them by the runtime.
"""
