"""Hidden check (stdlib only): reads expected.json beside this file, inspects /app, exits 0 iff solved.

This module is each task's ``tests/check.py`` (its source is copied there) and is imported on the
host to check trusted demonstrations in place (:func:`judge`), so both always apply the same rules.

It never runs, imports or follows anything left in /app: files are read with O_NOFOLLOW and
O_NONBLOCK one directory at a time and must be regular files. Code under test ("calls" tasks) runs
only in a sandbox of its own (no /tests, no /logs/verifier, no network), started by the
environment's probe runner behind the socket mounted for the verifier; only its printed results
come back and are compared with strict types. No probe runner: the task fails closed.
``--local`` (host-side checks of trusted demonstrations only) runs the probe as a subprocess.

Every trial starts this file once (``python3 -I -S``), so it imports only what its interpreter has loaded or
what costs nothing: JSON is read and written by json's own C half (``_json``: the scanner and encoder that
``json.loads`` and ``json.dumps`` use, with their settings; :func:`loads`, :func:`dumps`) and the probe runner is
reached through ``_socket``. Files are opened with ``posix`` (os's C half).
``import json`` would compile json's regular expressions and load ``re`` and ``enum`` (~7 ms of CPU a start
here, more than the bare interpreter's ~6 ms), ``socket`` ~3 ms more, ``os`` ~0.5 ms.
"""

import posix  # os's C half: os.py loads posixpath and collections.abc (~0.5 ms a start) for nothing used here
import sys

try:  # the check of a file's type (stat.py's C half)
    from _stat import S_ISREG
except ImportError:
    from stat import S_ISREG
try:  # json's C half, which json.loads and json.dumps use, without importing json (its import compiles regular
    # expressions and loads enum: ~7 ms of CPU at every check's start, more than the interpreter's own start)
    from _json import encode_basestring_ascii as _c_string, make_encoder as _c_encoder, make_scanner as _c_scanner
except ImportError:  # a Python without it: json itself
    _c_scanner = None

SOCKET = "/run/rsigym/probe.sock"
MAX_BYTES = 1 << 20
# The probe keeps its ``import json`` (~7 ms a start): the code under test has always found json, re, enum and
# the rest loaded from the standard library; without it a ``json.py`` left in /app (the cheating harness leaves
# one) would be imported in their place by a ``calc.py`` that imports json, and a verdict could change.
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


class _Decoder:
    """json.loads's decoder settings, as the C scanner reads them."""

    strict = True
    object_hook = object_pairs_hook = None
    parse_float, parse_int = float, int
    parse_constant = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}.__getitem__


_SPACE = " \t\n\r"  # JSON's whitespace (json.decoder.WHITESPACE)
_scan = _c_scanner(_Decoder) if _c_scanner is not None else None


def loads(text):
    """``json.loads(text)`` for a ``str``: the same C scanner, the same whitespace and the same errors
    (``ValueError``; ``RecursionError`` when nested too deep), without importing json.

    >>> loads(' {"a": [1, true, "x"]} '), loads("1.0")
    ({'a': [1, True, 'x']}, 1.0)
    >>> loads("[1] [2]")
    Traceback (most recent call last):
    ValueError: Extra data
    """
    if _scan is None:
        import json
        return json.loads(text)
    start = len(text) - len(text.lstrip(_SPACE))
    try:
        value, end = _scan(text, start)
    except StopIteration:
        raise ValueError("Expecting value") from None
    if text[end:].strip(_SPACE):
        raise ValueError("Extra data")
    return value


def _unserializable(value):
    raise TypeError(f"Object of type {value.__class__.__name__} is not JSON serializable")


def dumps(value):
    """``json.dumps(value)`` (its default settings) byte for byte, without importing json.

    >>> dumps({"calls": [["f", [1, 2]]], "ok": True, "s": "a"})
    '{"calls": [["f", [1, 2]]], "ok": true, "s": "a"}'
    """
    if _c_scanner is None:
        import json
        return json.dumps(value)
    if isinstance(value, str):
        return _c_string(value)
    return "".join(_c_encoder({}, _unserializable, _c_string, None, ": ", ", ", False, False, True)(value, 0))


def _walk(app, rel, leaf_flags):
    """An fd of app/rel opened without following any symlink on the way (or None)."""
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        return None
    try:
        fd = posix.open(app, posix.O_RDONLY | posix.O_DIRECTORY)
    except OSError:
        return None
    try:
        for part in parts[:-1]:
            nxt = posix.open(part, posix.O_RDONLY | posix.O_DIRECTORY | posix.O_NOFOLLOW, dir_fd=fd)
            posix.close(fd)
            fd = nxt
        return posix.open(parts[-1], leaf_flags | posix.O_NOFOLLOW, dir_fd=fd)
    except OSError:
        return None
    finally:
        posix.close(fd)


def read(app, rel):
    """A regular file's text (None if missing, special, a symlink, too large or not UTF-8)."""
    fd = _walk(app, rel, posix.O_RDONLY | posix.O_NONBLOCK)
    if fd is None:
        return None
    try:
        if not S_ISREG(posix.fstat(fd).st_mode):
            return None
        data = posix.read(fd, MAX_BYTES + 1)
        return None if len(data) > MAX_BYTES else data.decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    finally:
        posix.close(fd)


def is_dir(app, rel):
    fd = _walk(app, rel, posix.O_RDONLY | posix.O_DIRECTORY)
    if fd is None:
        return False
    posix.close(fd)
    return True


def probe(app, module, calls, local=False):
    """Run the calls in the code under test's own sandbox (``local``: a subprocess); parsed results or None."""
    request = {"module": module, "calls": calls, "app": app if local else "/app"}
    if local:
        import subprocess  # host-side checks only

        try:
            out = subprocess.run([sys.executable, "-I", "-c", PROBE], input=dumps(request).encode(), cwd=app,
                                 capture_output=True, timeout=10).stdout.decode("utf-8", "replace")
        except subprocess.TimeoutExpired:
            return None
    else:
        try:
            posix.stat(SOCKET)
        except OSError:
            print("no probe runner: code under test cannot run apart from the verifier here", file=sys.stderr)
            return None
        import _socket  # socket's C half: socket.py loads enum and selectors (~3 ms a start) for nothing used here

        message = dumps({"argv": ["python3", "-I", "-c", PROBE], "stdin": dumps(request),
                         "timeout_s": 10}).encode() + b"\n"
        try:
            conn = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
            try:
                conn.settimeout(30)
                conn.connect(SOCKET)
                conn.sendall(message)
                conn.shutdown(_socket.SHUT_WR)
                data = b""
                while len(data) <= 4 * MAX_BYTES:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
            finally:
                conn.close()
            out = loads(data.decode("utf-8"))["stdout"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
    lines = [line for line in str(out).splitlines() if line.strip()]
    try:
        return loads(lines[-1]) if lines else None
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
    here = __file__.rpartition("/")[0]  # the directory it was started from (test.sh: an absolute one)
    with open(f"{here}/expected.json" if "/" in __file__ else "expected.json") as fh:
        exp = loads(fh.read())
    app = posix.environ.get(b"RSIGYM_APP_DIR")  # os.environ's decoding
    app = "/app" if app is None else app.decode(sys.getfilesystemencoding(), "surrogateescape")
    sys.exit(0 if judge(exp, app, local="--local" in sys.argv[1:]) else 1)


if __name__ == "__main__":
    main()
