"""`speckv bench returns`: the session-return model trained and scored on a conversation trace (cli)."""
