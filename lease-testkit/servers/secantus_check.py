"""Check that SecantusDB (secantusd-py) starts and serves what lease tests use.

Starts `secantusd-py` (next to the current interpreter) on a free loopback
port with a temporary storage directory, then with pymongo checks `hello`,
a unique index with duplicate key error 11000, and an upserting
find_one_and_update with a pipeline update using $$NOW.
Prints one summary line and exits 0 on success, 1 on failure.
"""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_tcp(port, proc, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"secantusd-py exited with status {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"secantusd-py did not listen on port {port} within {timeout}s")


def check(port):
    import pymongo
    from pymongo.errors import DuplicateKeyError

    client = pymongo.MongoClient(
        f"mongodb://127.0.0.1:{port}/?directConnection=true", serverSelectionTimeoutMS=10000
    )
    hello = client.admin.command("hello")
    assert hello.get("isWritablePrimary"), f"not writable primary: {hello}"
    coll = client["lease_check"]["leases"]
    coll.create_index("name", unique=True)
    coll.insert_one({"name": "a"})
    try:
        coll.insert_one({"name": "a"})
        raise AssertionError("duplicate insert into a unique index succeeded")
    except DuplicateKeyError as e:
        assert e.code == 11000, f"duplicate key code {e.code}"
    doc = coll.find_one_and_update(
        {"name": "b"},
        [{"$set": {"at": "$$NOW", "fence": {"$add": [{"$ifNull": ["$fence", 0]}, 1]}}}],
        upsert=True,
        return_document=pymongo.ReturnDocument.AFTER,
    )
    assert doc["fence"] == 1 and doc.get("at") is not None, f"unexpected upsert result {doc}"
    client.close()
    return hello


def main():
    here = os.path.dirname(os.path.abspath(sys.executable))
    server = os.path.join(here, "secantusd-py")
    port = free_port()
    storage = tempfile.mkdtemp(prefix="lease-secantus-check-")
    proc = subprocess.Popen(
        [server, "--host", "127.0.0.1", "--port", str(port), "--storage-path", storage],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_tcp(port, proc)
        check(port)
    except Exception as e:  # noqa: BLE001
        proc.kill()
        _, err = proc.communicate()
        tail = err.decode(errors="replace").strip().splitlines()[-5:]
        print(f"secantus_check: FAILED: {e}; server stderr: {tail}", file=sys.stderr)
        return 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        shutil.rmtree(storage, ignore_errors=True)
    from importlib.metadata import version

    print(f"secantus_check: secantusdb {version('secantusdb')} ok: hello, unique index (11000), pipeline upsert with $$NOW")
    return 0


if __name__ == "__main__":
    sys.exit(main())
