"""Check that moto_serial.py behaves as a linearizable S3 store.

Starts moto_serial.py (next to this file) on a free loopback port with the
current interpreter, then with boto3:
  * a conditional create (If-None-Match: *) succeeds once and then fails
    with 412;
  * a conditional update (If-Match) with a stale ETag fails with 412 and
    with the current ETag succeeds;
  * racing conditional creates of one key have exactly one winner.
Prints one summary line and exits 0 on success, 1 on failure.

Usage: python moto_check.py [--rounds N] [--threads N]
"""

import argparse
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url, proc, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"moto_serial.py exited with status {proc.returncode}")
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"moto_serial.py did not answer on {url} within {timeout}s")


def status_of(err):
    return err.response.get("ResponseMetadata", {}).get("HTTPStatusCode")


def check(endpoint, rounds, threads):
    import boto3
    from botocore.config import Config
    from botocore.exceptions import ClientError

    s3 = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
        config=Config(max_pool_connections=threads * 2, retries={"max_attempts": 1}),
    )
    bucket = "lease-check"
    s3.create_bucket(Bucket=bucket)

    first = s3.put_object(Bucket=bucket, Key="k", Body=b"one", IfNoneMatch="*")
    try:
        s3.put_object(Bucket=bucket, Key="k", Body=b"two", IfNoneMatch="*")
        raise AssertionError("second If-None-Match: * create succeeded")
    except ClientError as e:
        assert status_of(e) == 412, f"If-None-Match: * conflict gave {status_of(e)}"

    second = s3.put_object(Bucket=bucket, Key="k", Body=b"three", IfMatch=first["ETag"])
    try:
        s3.put_object(Bucket=bucket, Key="k", Body=b"four", IfMatch=first["ETag"])
        raise AssertionError("If-Match with a stale ETag succeeded")
    except ClientError as e:
        assert status_of(e) == 412, f"stale If-Match gave {status_of(e)}"
    body = s3.get_object(Bucket=bucket, Key="k")["Body"].read()
    assert body == b"three", f"unexpected body {body!r}"
    assert second["ETag"] != first["ETag"]

    for r in range(rounds):
        key = f"race-{r}"
        wins = []
        errors = []
        barrier = threading.Barrier(threads)

        def racer(i):
            barrier.wait()
            try:
                s3.put_object(Bucket=bucket, Key=key, Body=f"{i}".encode(), IfNoneMatch="*")
                wins.append(i)
            except ClientError as e:
                if status_of(e) != 412:
                    errors.append(repr(e))
            except Exception as e:  # noqa: BLE001
                errors.append(repr(e))

        ts = [threading.Thread(target=racer, args=(i,)) for i in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert not errors, f"round {r}: unexpected errors {errors}"
        assert len(wins) == 1, f"round {r}: {len(wins)} winners of a conditional create"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--threads", type=int, default=8)
    args = parser.parse_args()

    here = os.path.dirname(os.path.abspath(__file__))
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, os.path.join(here, "moto_serial.py"), "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_http(endpoint + "/", proc)
        check(endpoint, args.rounds, args.threads)
    except Exception as e:  # noqa: BLE001
        print(f"moto_check: FAILED: {e}", file=sys.stderr)
        return 1
    finally:
        proc.kill()
        _, err = proc.communicate()
    import moto

    print(
        f"moto_check: moto {moto.__version__} ok: If-None-Match/If-Match honoured, "
        f"{args.rounds} rounds x {args.threads} racing creates had one winner each"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
