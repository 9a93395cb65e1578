"""Serving a listening socket's connections from one I/O thread (`multiplex.Multiplexer`).

The control socket and the HTTP endpoint face the same clients: some hostile, some merely slow,
some that never read their replies. Both used to carry their own copy of the selector loop that
bounds them, and the copies drifted; this package is the one copy. It imports only `config` and
the root foundation modules; the servers above it keep framing, routing and authentication.
"""
