#!/usr/bin/env python3
"""rsigym_verify: end an RSIGym research run, keep its records, score it (standard library only, Python >= 3.8).

The exported Harbor task (``rsigym export harbor``) runs this file, with the run's service and key
from ``$RSIGYM_URL`` / ``$RSIGYM_RUN_KEY``, in three places:

    rsigym_verify.py fresh --scenario NAME                 the healthcheck: exit 0 iff the run is new
    rsigym_verify.py collect --out DIR                     after the agent (Harbor's collect hook):
                                                           end the run if it is still open, write its
                                                           records into DIR (kept as trial artifacts)
    rsigym_verify.py verify --scenario NAME --out DIR      the verifier: end the run if still open, write
        [--collected DIR]                                  the service's reward to DIR/reward.txt, fresh
                                                           records to DIR/rsigym/, and compare them with
                                                           the collected ones

"End the run" means: if the episode is still open (the agent never submitted), submit the initial
system (``checkpoint=base harness=initial``: reward 0) and wait until the service says it is over.
The reward is the service's end state of the run (``GET /v1/run``: ``reward`` once ``state`` is
``done``; 0 for a run closed or interrupted without a submission); nothing the agent wrote is read
for it. Exit status: 0 done, 1 the run is not fresh (``fresh``), 2 wrong run (another scenario), 3
the service cannot be reached or answers nonsense (then no reward file is written at all).

>>> canonical_digest(b'{"b": 1, "a": [1, 2]}') == canonical_digest(b'{"a":[1,2],"b":1}')
True
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

RECORDS = {"audit.json": "/v1/audit", "ledger.json": "/v1/ledger", "ledger.sqlite": "/v1/ledger.sqlite",
           "trajectory.json": "/v1/trajectory"}
MAX_RECORD_BYTES = 64 << 20
INITIAL_SYSTEM = {"checkpoint": "base", "harness": "initial"}


class ServiceError(Exception):
    """The service could not be reached, or answered something that is not what it documents."""


def _opener(url):
    host = (urllib.parse.urlsplit(url).hostname or "").lower()
    if host in ("localhost", "127.0.0.1", "::1") or host.startswith("127."):
        return urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never via a proxy
    return urllib.request.build_opener()


class Service:
    """The run's service: ``$RSIGYM_URL`` with ``$RSIGYM_RUN_KEY`` as the bearer key."""

    def __init__(self, url, key, timeout=60.0):
        if not url or not key:
            raise ServiceError("RSIGYM_URL and RSIGYM_RUN_KEY must be set (task.toml [environment.env])")
        self.url, self.key, self.timeout = url.rstrip("/"), key, timeout

    def request(self, method, path, body=None, raw=False):
        """``(status, parsed JSON or bytes)``; :class:`ServiceError` when there is no proper answer."""
        data = None if body is None else json.dumps(body).encode("utf-8")
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Authorization", "Bearer " + self.key)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with _opener(self.url).open(req, timeout=self.timeout) as response:
                status, payload = response.status, response.read(MAX_RECORD_BYTES + 1)
        except urllib.error.HTTPError as err:
            status, payload = err.code, err.read(MAX_RECORD_BYTES + 1)
        except (OSError, ValueError) as exc:
            raise ServiceError("cannot reach %s: %s" % (self.url, exc)) from exc
        if len(payload) > MAX_RECORD_BYTES:
            raise ServiceError("%s %s: the answer is larger than %d bytes" % (method, path, MAX_RECORD_BYTES))
        if raw and status == 200:
            return status, payload
        try:
            return status, json.loads(payload.decode("utf-8"))
        except ValueError:
            raise ServiceError("%s %s: HTTP %d with a body that is not JSON" % (method, path, status)) from None

    def run(self):
        status, body = self.request("GET", "/v1/run")
        if status != 200 or not isinstance(body, dict) or "state" not in body:
            raise ServiceError("GET /v1/run: HTTP %d %r" % (status, body))
        return body

    def call(self, tool, args):
        status, reply = self.request("POST", "/v1/tools/" + tool, args)
        if not isinstance(reply, dict) or "ok" not in reply:
            raise ServiceError("POST /v1/tools/%s: HTTP %d, not a tool reply" % (tool, status))
        return reply


def end_run(service, deadline_s=1500.0):
    """End the run if its episode is still open: submit the initial system, then ``wait`` until the
    service says the episode is over. ``(final GET /v1/run, what was done)``."""
    run = service.run()
    done = {"was": run["state"], "submitted_initial": False, "waits": 0}
    if run["state"] != "active":
        return run, done
    reply = service.call("submit", INITIAL_SYSTEM)
    done["submitted_initial"] = bool(reply.get("ok"))
    if not reply.get("ok"):
        done["submit_refused"] = reply.get("error")  # e.g. submission_pending: the agent's own is being scored
    stop = time.monotonic() + deadline_s
    run = service.run()
    while run["state"] == "active" and time.monotonic() < stop:
        reply = service.call("wait", {})
        done["waits"] += 1
        if not reply.get("ok"):
            time.sleep(1.0)
        run = service.run()
    return run, done


def canonical_digest(data):
    """sha256 of JSON bytes in canonical form (sorted keys, no spaces), or of the bytes themselves."""
    try:
        data = json.dumps(json.loads(data.decode("utf-8")), sort_keys=True, separators=(",", ":")).encode()
    except ValueError:
        pass
    return hashlib.sha256(data).hexdigest()


def _fresh_dir(path):
    """An empty directory at ``path``: whatever was there (a symlink included) is removed, never followed."""
    if os.path.islink(path) or os.path.isfile(path):
        os.unlink(path)
    elif os.path.isdir(path):
        shutil.rmtree(path)
    os.makedirs(path)


def _write(path, data):
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def fetch_records(service):
    """``{file name: bytes}`` of the run's records (the episode must be over)."""
    out = {}
    for name, path in RECORDS.items():
        status, body = service.request("GET", path, raw=name.endswith(".sqlite"))
        if status != 200:
            raise ServiceError("GET %s: HTTP %d %r" % (path, status, body))
        out[name] = body if isinstance(body, bytes) else (json.dumps(body, indent=1, sort_keys=True) + "\n").encode()
    return out


def write_records(directory, records, extra):
    """Write ``records`` and ``extra`` (JSON documents) into a fresh ``directory`` with a manifest of digests."""
    _fresh_dir(directory)
    files = dict(records)
    for name, doc in extra.items():
        files[name] = (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()
    manifest = {name: canonical_digest(data) for name, data in sorted(files.items())}
    files["manifest.json"] = (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode()
    for name, data in files.items():
        _write(os.path.join(directory, name), data)
    return manifest


def compare(collected_dir, records):
    """Each record's verdict: ``match`` when the collected copy equals the service's, else ``differs`` or ``missing``."""
    verdicts = {}
    for name, data in records.items():
        path = os.path.join(collected_dir or "", name)
        if not collected_dir or os.path.islink(path) or not os.path.isfile(path):
            verdicts[name] = "missing"
            continue
        with open(path, "rb") as f:
            theirs = f.read(MAX_RECORD_BYTES + 1)
        verdicts[name] = "match" if canonical_digest(theirs) == canonical_digest(data) else "differs"
    return verdicts


def reward_of(run):
    """The service's reward for an ended run: its normalized gain, or 0 when it ended without one."""
    if run.get("state") == "done" and isinstance(run.get("reward"), (int, float)):
        return float(run["reward"])
    return 0.0


def _end_info(records):
    try:
        return json.loads(records["trajectory.json"].decode("utf-8"))["final_metrics"]["extra"]
    except (KeyError, ValueError, TypeError):
        return None


def cmd_fresh(service, args):
    run = service.run()
    if args.scenario and run.get("scenario") != args.scenario:
        print("rsigym_verify: this run is of scenario %r, the task is for %r" % (run.get("scenario"), args.scenario))
        return 2
    if run["state"] != "active" or int(run.get("steps") or 0) != 0:
        print("rsigym_verify: the run is not new (state %s, %s steps): each trial needs a run of its own"
              % (run["state"], run.get("steps")))
        return 1
    print("rsigym_verify: run %s is new (%s)" % (run.get("run_id"), run.get("scenario")))
    return 0


def cmd_collect(service, args):
    run, done = end_run(service, args.deadline_s)
    records = fetch_records(service)
    write_records(args.out, records, {"run.json": run, "finish.json": {"stage": "collect", **done}})
    print("rsigym_verify: run %s is %s; records in %s" % (run.get("run_id"), run["state"], args.out))
    return 0


def cmd_verify(service, args):
    run, done = end_run(service, args.deadline_s)
    if args.scenario and run.get("scenario") != args.scenario:
        print("rsigym_verify: this run is of scenario %r, the task is for %r: no reward"
              % (run.get("scenario"), args.scenario))
        return 2
    if run["state"] == "active":
        raise ServiceError("the run did not end within %g s" % args.deadline_s)
    records = fetch_records(service)
    reward = reward_of(run)
    report = {"reward": reward, "run_id": run.get("run_id"), "scenario": run.get("scenario"),
              "state": run["state"], "code": run.get("code"), "ended_by_verifier": done,
              "end": _end_info(records), "collected_records": compare(args.collected, records),
              "reward_source": "GET /v1/run of the service (the run's end state), never a file"}
    write_records(os.path.join(args.out, "rsigym"), records, {"run.json": run, "report.json": report})
    for name in ("reward.json", "reward.txt"):  # only this process's reward counts
        path = os.path.join(args.out, name)
        if os.path.lexists(path):
            os.unlink(path)
    _write(os.path.join(args.out, "reward.txt"), ("%r\n" % reward).encode())
    print("rsigym_verify: run %s %s; reward %r; collected records: %s"
          % (run.get("run_id"), run["state"], reward, report["collected_records"]))
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(prog="rsigym_verify", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    fresh = sub.add_parser("fresh")
    fresh.add_argument("--scenario")
    collect = sub.add_parser("collect")
    collect.add_argument("--out", required=True)
    verify = sub.add_parser("verify")
    verify.add_argument("--scenario")
    verify.add_argument("--out", default="/logs/verifier")
    verify.add_argument("--collected")
    for p in (collect, verify):
        p.add_argument("--deadline-s", type=float, default=1500.0)
    args = parser.parse_args(argv)
    try:
        service = Service(os.environ.get("RSIGYM_URL"), os.environ.get("RSIGYM_RUN_KEY"))
        return {"fresh": cmd_fresh, "collect": cmd_collect, "verify": cmd_verify}[args.command](service, args)
    except ServiceError as exc:
        print("rsigym_verify: %s" % exc, file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
