"""Run SecantusDB (secantusd-py), executing one command at a time.

SecantusDB serves each connection on a thread of its own. A command binds
`$$NOW` when it starts, then waits for the collection's lock to apply its
write, so writes racing on one document land out of `$$NOW` order: with 8
connections bumping one document, a third of the writes stamped a `$$NOW`
older than a write that landed before them, by up to about 20 ms, and by
hundreds of milliseconds on a loaded machine. A lease renewal bound early and
landing late then writes an expiry older than the one before it, or extends a
lease that expired while it waited. Lease tests need a store that applies
each write at the instant it judges it, as a MongoDB primary does to within
a lock wait, so this launcher wraps the command dispatcher in one global
lock: a command binds `$$NOW`, reads and writes inside it.

Not serialised: `hello` / `isMaster` (the handshake and the drivers'
monitors; an awaitable hello waits after the dispatcher returns, outside the
lock anyway) and `getMore` (a getMore on an awaitData cursor waits inside the
dispatcher for new entries, which only other commands can write). A
`failCommand` fail point with `blockConnection` would hold the lock while it
blocks; lease tests configure none.

Usage: python secantus_serial.py <secantusd-py arguments>
"""

import sys
import threading

UNSERIALISED = frozenset({"hello", "isMaster", "ismaster", "getMore"})


def serial(dispatch):
    lock = threading.Lock()

    def wrapped(doc, ctx):
        name = next(iter(doc), "") if hasattr(doc, "keys") else ""
        if name in UNSERIALISED:
            return dispatch(doc, ctx)
        with lock:
            return dispatch(doc, ctx)

    return wrapped


def main():
    import secantus.server
    from secantus.cli import main as secantus_main

    dispatch = getattr(secantus.server, "dispatch", None)
    if not callable(dispatch):
        print(
            "secantus_serial: this SecantusDB has no secantus.server.dispatch to serialise",
            file=sys.stderr,
        )
        return 2
    # The connection threads look the name up in their module on every call.
    secantus.server.dispatch = serial(dispatch)
    sys.argv[0] = "secantusd-py"
    return secantus_main()


if __name__ == "__main__":
    sys.exit(main())
