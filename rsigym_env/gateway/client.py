#!/usr/bin/env python3
"""rsigym-call: call one tool of an RSIGym research run from a shell (Python >= 3.8, standard library only).

    rsigym-call TOOL [NAME=VALUE ...] [NAME@=FILE ...]     call a tool; prints what you read
    rsigym-call TOOL -                                     the arguments as one JSON object on stdin
    rsigym-call balance | jobs | job JOB_ID | observation | tools | run

VALUE is parsed as JSON when it parses (k=3 -> 3, datasets='["ds-1","ds-2"]' -> a list, x=null ->
null) and is a string otherwise (checkpoint=ckpt-1); quote a string that looks like JSON
(name='"true"'). NAME@=FILE reads the value, as a string, from FILE.

The service is $RSIGYM_URL (e.g. http://127.0.0.1:8765) and the run key $RSIGYM_RUN_KEY (or
--url / --key). Output: the reply's text (--json: the whole reply). Exit status: 0 the call ran,
1 refused (the error code is printed on stderr as "rsigym-call: <code>: <message>"), 2 bad usage,
3 the service could not be reached or did not answer properly.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request

VIEWS = {"balance": "/v1/balance", "jobs": "/v1/jobs", "observation": "/v1/observation", "tools": "/v1/tools",
         "run": "/v1/run"}
USAGE = "usage: rsigym-call [--json] [--url URL] [--key KEY] [--timeout S] TOOL [NAME=VALUE ...] | TOOL - | " \
        "balance | jobs | job ID | observation | tools | run"


class UsageError(Exception):
    pass


def parse_value(text):
    """``text`` as JSON if it parses, else the string itself.

    >>> parse_value("3"), parse_value('["ds-1"]'), parse_value("ckpt-1"), parse_value("null"), parse_value('"1"')
    (3, ['ds-1'], 'ckpt-1', None, '1')
    """
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse_args(items, stdin=None):
    """The tool arguments of ``NAME=VALUE`` / ``NAME@=FILE`` items (or ``-``: a JSON object from ``stdin``).

    >>> parse_args(["k=1", "checkpoint=base", "datasets=[\\"ds-1\\"]"])
    {'k': 1, 'checkpoint': 'base', 'datasets': ['ds-1']}
    """
    if list(items) == ["-"]:
        data = json.loads((stdin or sys.stdin).read() or "{}")
        if not isinstance(data, dict):
            raise UsageError("the JSON on stdin must be an object of arguments")
        return data
    args = {}
    for item in items:
        name, sep, raw = item.partition("=")
        if not sep:
            raise UsageError("argument %r is not NAME=VALUE" % item)
        if name.endswith("@"):
            name = name[:-1]
            with open(raw, encoding="utf-8") as f:
                value = f.read()
        else:
            value = parse_value(raw)
        if not name:
            raise UsageError("argument %r has no name" % item)
        args[name] = value
    return args


def _opener(url):
    host = (urllib.parse.urlsplit(url).hostname or "").lower()
    if host in ("localhost", "127.0.0.1", "::1") or host.startswith("127."):
        return urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never via a proxy
    return urllib.request.build_opener()


def request(url, key, method, path, body=None, timeout=120.0):
    """``(status, parsed JSON body)`` of one request; ``OSError`` if the service cannot be reached."""
    data = None if body is None else json.dumps(body).encode("utf-8")
    req = urllib.request.Request(url.rstrip("/") + path, data=data, method=method)
    req.add_header("Authorization", "Bearer " + key)
    req.add_header("Accept", "application/json")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with _opener(url).open(req, timeout=timeout) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as err:
        status, raw = err.code, err.read()
    try:
        return status, json.loads(raw.decode("utf-8"))
    except ValueError:
        raise OSError("HTTP %d with a body that is not JSON: %r" % (status, raw[:200])) from None


def main(argv=None, stdin=None, stdout=None, stderr=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    out, err = stdout or sys.stdout, stderr or sys.stderr
    as_json, url, key, timeout = False, os.environ.get("RSIGYM_URL"), os.environ.get("RSIGYM_RUN_KEY"), 120.0
    try:
        while argv and argv[0].startswith("--"):
            flag = argv.pop(0)
            if flag == "--json":
                as_json = True
            elif flag in ("--url", "--key", "--timeout") and argv:
                value = argv.pop(0)
                if flag == "--url":
                    url = value
                elif flag == "--key":
                    key = value
                else:
                    timeout = float(value)
            elif flag == "--help":
                out.write(__doc__ or USAGE + "\n")
                return 0
            else:
                raise UsageError("unknown option %s" % flag)
        if not argv:
            raise UsageError("no tool given")
        if not url or not key:
            raise UsageError("set RSIGYM_URL and RSIGYM_RUN_KEY (or give --url and --key)")
        tool, rest = argv[0], argv[1:]
        if tool in VIEWS or tool == "job":
            if tool == "job":
                if len(rest) != 1:
                    raise UsageError("job takes one job id")
                path = "/v1/jobs/" + urllib.parse.quote(rest[0], safe="")
            elif rest:
                raise UsageError("%s takes no arguments" % tool)
            else:
                path = VIEWS[tool]
            status, body = request(url, key, "GET", path, timeout=timeout)
            if status != 200:
                err.write("rsigym-call: %s: %s\n" % (body.get("error"), body.get("message")))
                return 1
            out.write(json.dumps(body, indent=1) + "\n")
            return 0
        args = parse_args(rest, stdin)
        status, reply = request(url, key, "POST", "/v1/tools/" + urllib.parse.quote(tool, safe=""), args, timeout)
    except UsageError as exc:
        err.write("rsigym-call: %s\n%s\n" % (exc, USAGE))
        return 2
    except (OSError, ValueError) as exc:
        err.write("rsigym-call: cannot reach %s: %s\n" % (url, exc))
        return 3
    if not isinstance(reply, dict) or "ok" not in reply:
        err.write("rsigym-call: HTTP %d: not a tool reply: %r\n" % (status, reply))
        return 3
    out.write((json.dumps(reply, indent=1) if as_json else str(reply.get("text", ""))) + "\n")
    if not reply.get("ok"):
        err.write("rsigym-call: %s: %s\n" % (reply.get("error"), reply.get("message")))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
