"""Reconcile: join call logs with a provider's bill by request id."""
