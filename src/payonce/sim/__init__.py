"""The simulated LLM provider (``payonce sim``)."""
