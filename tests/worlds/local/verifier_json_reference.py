"""The hidden check as it was through local result version 6 (round 7, main 5403cd6): json and socket imported.

Kept verbatim below this line as the reference the json-free check (:mod:`rsigym_env.worlds.local.benchmarks.verifier`)
must agree with (tests/worlds/local/test_verifier_imports.py). Its own docstring was:

Hidden check (stdlib only): reads expected.json beside this file, inspects /app, exits 0 iff solved.

This module is each task's ``tests/check.py`` (its source is copied there) and is imported on the
host to check trusted demonstrations in place (:func:`judge`), so both always apply the same rules.

It never runs, imports or follows anything left in /app: files are read with O_NOFOLLOW and
O_NONBLOCK one directory at a time and must be regular files. Code under test ("calls" tasks) runs
only in a sandbox of its own (no /tests, no /logs/verifier, no network), started by the
environment's probe runner behind the socket mounted for the verifier; only its printed results
come back and are compared with strict types. No probe runner: the task fails closed.
``--local`` (host-side checks of trusted demonstrations only) runs the probe as a subprocess.
"""

import json
import os
import stat
import sys

SOCKET = "/run/rsigym/probe.sock"
MAX_BYTES = 1 << 20
PROBE = """import json, sys
sys.dont_write_bytecode = True
req = json.loads(sys.stdin.read())
sys.path.insert(0, req["app"])
try:
    m = __import__(req["module"])
except BaseException as e:
    out = {"import_error": type(e).__name__}
else:
    res = []
    for name, args in req["calls"]:
        try:
            v = getattr(m, name)(*args)
            res.append(["value", v if type(v) in (int, bool, str) else repr(v)[:200]])
        except BaseException as e:
            res.append(["error", type(e).__name__])
    out = {"results": res}
sys.stdout.write("\\n" + json.dumps(out) + "\\n")
sys.stdout.flush()
"""


def _walk(app, rel, leaf_flags):
    """An fd of app/rel opened without following any symlink on the way (or None)."""
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        return None
    try:
        fd = os.open(app, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        for part in parts[:-1]:
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nxt
        return os.open(parts[-1], leaf_flags | os.O_NOFOLLOW, dir_fd=fd)
    except OSError:
        return None
    finally:
        os.close(fd)


def read(app, rel):
    """A regular file's text (None if missing, special, a symlink, too large or not UTF-8)."""
    fd = _walk(app, rel, os.O_RDONLY | os.O_NONBLOCK)
    if fd is None:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, MAX_BYTES + 1)
        return None if len(data) > MAX_BYTES else data.decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    finally:
        os.close(fd)


def is_dir(app, rel):
    fd = _walk(app, rel, os.O_RDONLY | os.O_DIRECTORY)
    if fd is None:
        return False
    os.close(fd)
    return True


def probe(app, module, calls, local=False):
    """Run the calls in the code under test's own sandbox (``local``: a subprocess); parsed results or None."""
    import socket  # only code tasks run anything (imports are a trial's start-up cost)

    request = {"module": module, "calls": calls, "app": app if local else "/app"}
    if local:
        import subprocess  # host-side checks only

        try:
            out = subprocess.run([sys.executable, "-I", "-c", PROBE], input=json.dumps(request).encode(), cwd=app,
                                 capture_output=True, timeout=10).stdout.decode("utf-8", "replace")
        except subprocess.TimeoutExpired:
            return None
    else:
        if not os.path.exists(SOCKET):
            print("no probe runner: code under test cannot run apart from the verifier here", file=sys.stderr)
            return None
        message = json.dumps({"argv": ["python3", "-I", "-c", PROBE], "stdin": json.dumps(request),
                              "timeout_s": 10}).encode() + b"\n"
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.settimeout(30)
                conn.connect(SOCKET)
                conn.sendall(message)
                conn.shutdown(socket.SHUT_WR)
                data = b""
                while len(data) <= 4 * MAX_BYTES:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
            out = json.loads(data.decode("utf-8"))["stdout"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
    lines = [line for line in str(out).splitlines() if line.strip()]
    try:
        return json.loads(lines[-1]) if lines else None
    except ValueError:
        return None


def same(got, want):
    return type(got) is type(want) and got == want


def judge(exp, app, local=False):
    """Is the app directory ``app`` a solution of the task whose hidden data is ``exp``?"""
    kind = exp["kind"]
    if kind == "answer":
        return (read(app, "answer.txt") or "").strip().upper() == str(exp["answer"]).upper()
    if kind == "files":
        return (all((read(app, p) or "\0").strip() == c.strip() for p, c in exp["files"].items())
                and all(is_dir(app, d) for d in exp.get("dirs", [])))
    if kind == "calls":
        out = probe(app, exp["module"], exp["calls"], local)
        results = out.get("results") if isinstance(out, dict) else None
        return (isinstance(results, list) and len(results) == len(exp["want"])
                and all(isinstance(r, list) and len(r) == 2 and r[0] == "value" and same(r[1], w)
                        for r, w in zip(results, exp["want"])))
    return False


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "expected.json")) as fh:
        exp = json.load(fh)
    app = os.environ.get("RSIGYM_APP_DIR", "/app")
    sys.exit(0 if judge(exp, app, local="--local" in sys.argv[1:]) else 1)


if __name__ == "__main__":
    main()
