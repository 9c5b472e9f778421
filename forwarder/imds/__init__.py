"""The IMDS side: the client (deadlines, body cap), the shared request limit and the
document diff."""
