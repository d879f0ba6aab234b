"""chainrt's public test kit: a throw-away redis-server and the conformance suites.

Users can run the same suites against their own store or limiter implementations.
"""
