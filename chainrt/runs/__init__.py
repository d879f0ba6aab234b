"""What any process may do to a stored run: cancel it, own it (leases), continue it (signals),
and decide whether to execute it at all (trust). The runner and ``chainrt serve`` both use these."""
