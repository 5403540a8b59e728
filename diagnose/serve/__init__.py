"""`memdiag serve`: alerts in, diagnoses out, OOM kills recorded — an agent on the host."""
