"""Run moto's S3 server, serving one request at a time.

moto checks S3 conditional writes (`If-None-Match: *`, `If-Match: <etag>`)
and then stores the object in two separate steps, so two racing conditional
PUTs can both win. Lease tests need a linearizable store, so this launcher
wraps moto's WSGI application in a single global lock held for the whole
request, including the reading of the request body and the producing of the
response body.

Usage: python moto_serial.py --host 127.0.0.1 --port PORT
"""

import argparse
import os
import signal
import sys
import threading


def serial(app):
    lock = threading.Lock()

    def wrapped(environ, start_response):
        with lock:
            result = app(environ, start_response)
            try:
                body = b"".join(result)
            finally:
                close = getattr(result, "close", None)
                if close is not None:
                    close()
        return [body]

    return wrapped


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    os.environ.setdefault("MOTO_PORT", str(args.port))

    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    app = serial(DomainDispatcherApplication(create_backend_app))
    server = make_server(
        args.host,
        args.port,
        app,
        threaded=True,
        request_handler=MotoRequestHandler,
    )

    def stop(signum, frame):
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"moto_serial: serving on http://{args.host}:{args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
