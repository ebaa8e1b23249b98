#!/usr/bin/env python3
"""The harness's control loop (stdlib only), run as ``python3 /harness/agent.py`` inside the sandbox.

Environment: ``RSIGYM_MODEL_SOCKET`` (unix socket) or ``RSIGYM_MODEL_URL`` (http base URL),
``RSIGYM_MODEL`` (model id), ``RSIGYM_INSTRUCTION_FILE``, ``RSIGYM_SEED``; ``RSIGYM_APP_DIR``
(default ``/app``) and ``RSIGYM_LOGS_DIR`` (default ``/logs/agent``); ``RSIGYM_HARNESS_DIR``
(default: this file's directory) holds ``harness.toml`` and ``prompt.md``.

Loop: system prompt (``prompt.md``) + the instruction; each turn the model replies with one line —
``$ <command>`` (run at the app dir; the reply is ``OUT: <first 200 bytes>``), ``ANSWER: <text>``
(written to ``answer.txt``; ends) or ``DONE`` (ends). Every request carries
``seed = f(RSIGYM_SEED, turn, retry)``. ``trajectory.json`` records each step (messages sent, reply,
command, output, token usage, retries) and the end reason.

Remedies (``harness.toml``; the minimal harness has them all off):

* ``[generation] on_truncation = "continue"`` — a reply cut at ``max_output_tokens`` is asked
  again with ``continue_max_tokens`` (``"stop"``: the attempt ends, ``truncated``).
* ``[completion] verify_before_submit = true`` — before accepting ``ANSWER``/``DONE``, run
  ``check.sh`` in the app dir if there is one; on failure reply ``OUT: check failed: ...`` and go on.
* ``[shell] persistent = true`` — one session for every command, opened as an interactive shell (it
  reads the project's ``.bashrc`` in the app dir, if any), keeping the working directory and exported
  variables across commands.
* ``[loop] detect = true`` — a command identical to the previous one is resampled at
  ``loop_temperature``.
* ``[edits] check = true`` — after a command that changed a ``.py`` file, compile it (``py_compile``'s check); if it
  no longer compiles, restore the files and resample.
* ``[skills] load_skills = true`` — add the ``Usage:`` lines of the skills named in the instruction
  (``skills/*/SKILL.md``) to the prompt; when the instruction names none, those of every skill there
  (the harness cannot tell which tool such a task needs).

No remedy is free of cost, though only some costs bite on the local tasks. The model's context is small
(512 tokens) and the server refuses a request whose prompt plus ``max_tokens`` does not fit
(``context_length_exceeded``; the attempt ends ``context_full``): a larger ``max_output_tokens`` or
``continue_max_tokens`` reserves more of it, so a long prompt fails at once and a conversation ends
sooner; loaded skill lines lengthen the prompt, and on a task whose environment ships tools it does not
need they take the room its own turns need and show the model commands it copies instead of doing its
task. ``continue`` spends a second request (and tokens) on every cut reply; ``persistent`` runs every command
where the project's shell profile leaves the session (a task whose steps assume a fresh shell at the app dir
then misses its files; each command records the session's directory as ``cwd``); ``verify`` spends the
check's time and, when the check fails, a turn; ``detect`` spends requests; ``check`` spends a compile per edit.

End reasons → failure labels (``failure_label``; only for attempts the verifier scored 0):

* ``truncated`` → ``truncated_output``;  ``error`` → ``harness_error``;
* ``max_turns`` / ``context_full`` with a repeated command → ``action_loop``;
* otherwise, by the trajectory's signals: a ``cd`` in a non-persistent shell → ``lost_shell_state``;
  an edit left a ``.py`` file that does not compile → ``unchecked_edit``; a skill the instruction
  names (``skills_named``: a library of tools the task does not use is no defect), but no skill shown
  or read → ``missing_skill``; ``done``/``answer`` unverified while a ``check.sh`` existed
  → ``unverified_completion``; anything else → ``wrong_answer``.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
try:  # imported as part of the rsigym_env package
    from .llm import Client, LLMError
except ImportError:  # run as a script: python3 /harness/agent.py
    sys.path.insert(0, HERE)
    from llm import Client, LLMError  # noqa: E402

OUT_BYTES = 200
DEFAULTS = {
    "generation": {"max_output_tokens": 72, "on_truncation": "stop", "continue_max_tokens": 224, "temperature": 0.7},
    "agent": {"max_turns": 8, "command_timeout_sec": 10},
    "completion": {"verify_before_submit": False},
    "shell": {"persistent": False},
    "loop": {"detect": False, "loop_temperature": 1.2, "max_resamples": 2},
    "edits": {"check": False, "max_resamples": 2},
    "skills": {"load_skills": False},
}


# --- settings ----------------------------------------------------------------------------------


def load_config(path: str) -> dict:
    """``harness.toml`` merged over ``DEFAULTS`` (section → key → value).

    >>> load_config("/nonexistent.toml")["shell"]["persistent"]
    False
    """
    cfg = {k: dict(v) for k, v in DEFAULTS.items()}
    if os.path.exists(path):
        with open(path, "rb") as fh:
            data = read_toml(fh.read())
        for section, values in data.items():
            if isinstance(values, dict):
                cfg.setdefault(section, {}).update(values)
    gen = cfg["generation"]
    if "max_tokens" in gen:  # alias
        gen["max_output_tokens"] = gen["max_tokens"]
    if gen["on_truncation"] not in ("stop", "continue"):
        raise ValueError('[generation] on_truncation must be "stop" or "continue"')
    return cfg


# A plain line of harness.toml: blank, or a comment, a `[table]` or a `key = value` (true/false, a decimal
# integer or fraction, a string without escapes), each with an optional comment; TOML's whitespace is space or tab.
_TOML_LINE = re.compile(r"""[ \t]*(?:(?:\[([A-Za-z0-9_-]+)\]|([A-Za-z0-9_-]+)[ \t]*=[ \t]*"""
                        r"""(true|false|[+-]?(?:0|[1-9][0-9]*)(\.[0-9]+)?|"[^"\\\x00-\x1f\x7f]*"|'[^'\x00-\x1f\x7f]*'))"""
                        r"""[ \t]*)?(?:#[^\x00-\x08\x0a-\x1f\x7f]*)?""")


def read_toml(raw: bytes) -> dict:
    """A TOML document → ``tomllib.loads``'s value, or its error. A document of plain lines (``_TOML_LINE``) is
    read here; any other is read by ``tomllib``, which imports ``typing`` (~8 ms of the harness's start).

    >>> read_toml(b'[a]\\nx = 1  # one\\ny = "s"\\n[b]\\nz = -0.5\\n'), read_toml(b"x = 1_000")
    ({'a': {'x': 1, 'y': 's'}, 'b': {'z': -0.5}}, {'x': 1000})
    """
    try:
        data: dict = {}
        table = data
        lines = raw.decode("utf-8").split("\n")
        for i, line in enumerate(lines):
            m = _TOML_LINE.fullmatch(line[:-1] if line.endswith("\r") and i < len(lines) - 1 else line)
            if m is None or m.group(1) in data or m.group(2) in table:  # not plain, or a table or key twice
                raise ValueError(line)
            name, key, value = m.group(1, 2, 3)
            if name:
                table = data[name] = {}
            elif key:
                table[key] = (value == "true" if value in ("true", "false") else value[1:-1] if value[0] in "\"'"
                              else float(value) if m.group(4) else int(value))
        return data
    except ValueError:  # (a UnicodeDecodeError too: tomllib raises the same)
        import tomllib

        return tomllib.loads(raw.decode("utf-8"))


# --- the action language -------------------------------------------------------------------------


def parse_action(text: str) -> tuple[str, str]:
    """``$ cmd`` → ("cmd", cmd); ``... ANSWER: x`` → ("answer", x); ``DONE`` → ("done", "").

    >>> parse_action("1+2=3 ANSWER: 3"), parse_action("$ ls"), parse_action("hm")
    (('answer', '3'), ('cmd', 'ls'), ('invalid', 'hm'))
    """
    text = (text or "").strip()
    if "ANSWER:" in text:
        rest = text.rsplit("ANSWER:", 1)[1].strip()
        return "answer", rest.splitlines()[0].strip() if rest else ""
    first = text.splitlines()[0].strip() if text else ""
    if first.startswith("$"):
        return "cmd", first[1:].strip()
    if first.startswith("DONE"):
        return "done", ""
    return "invalid", first


def observation(output: str, code: int) -> str:
    out = output.encode("utf-8", "replace")[:OUT_BYTES].decode("utf-8", "ignore").strip()
    if not out:
        return f"OUT: (exit {code})"
    return f"OUT: {out}" + (f" (exit {code})" if code else "")


def request_seed(base: int, turn: int, retry: int) -> int:
    """The seed of a request: a function of the trial seed, the turn and the retry only.

    >>> request_seed(7, 2, 1) == request_seed(7, 2, 1) != request_seed(7, 2, 0)
    True
    """
    return (base * 1_000_003 + turn * 1009 + retry * 17 + 1) % (2**31 - 1)


# --- the shell ---------------------------------------------------------------------------------


PROFILE = ".bashrc"
"""The project's shell rc file (in the app dir): a persistent session reads it when it opens, as an
interactive shell reads ``~/.bashrc`` (the sandbox's HOME is not the project's); ``bash -c`` does not."""


class Shell:
    """Runs commands at the app dir: a fresh ``bash`` each time, or (``persistent``) one session that
    opens as an interactive shell (it reads the project's ``.bashrc``) and carries the working directory
    and exported variables from one command to the next."""

    def __init__(self, app: str, persistent: bool, timeout: float):
        self.app, self.persistent, self.timeout = app, persistent, timeout
        self.cwd = app
        self.exports = ""
        self._state: str | None = None  # the persistent shell's state file, made by its first command

    def run(self, command: str) -> tuple[str, int]:
        # imported when first needed: every trial starts a fresh interpreter, and imports are most of its
        # start-up (an attempt that only answers never runs a command)
        import subprocess

        if self.persistent:
            import shlex
            import tempfile

            start = ""
            if self._state is None:  # the session opens as an interactive shell does: it reads its rc file
                self._state = tempfile.NamedTemporaryFile(prefix="rsigym-shell-", delete=False).name
                start = f"[ -f {PROFILE} ] && . ./{PROFILE}\n"
            script = (f"cd {shlex.quote(self.cwd)} 2>/dev/null || cd {shlex.quote(self.app)}\n{start}{self.exports}\n"
                      f"{command}\n__rc=$?\n{{ pwd; export -p; }} > {shlex.quote(self._state)}\nexit $__rc\n")
        else:
            script = command
        try:
            proc = subprocess.run(["bash", "-c", script], cwd=self.app, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, timeout=self.timeout)
            out, code = proc.stdout.decode("utf-8", "replace"), proc.returncode
        except subprocess.TimeoutExpired:
            return f"timeout after {self.timeout:g}s", 124
        if self.persistent:
            try:
                with open(self._state) as fh:
                    lines = fh.read().splitlines()
                if lines:
                    self.cwd = lines[0]
                    self.exports = "\n".join(l for l in lines[1:] if l.startswith("declare -x ") and "=" in l)
            except OSError:
                pass
        return out, code

    def close(self) -> None:
        if self._state is None:
            return
        try:
            os.unlink(self._state)
        except OSError:
            pass


def py_files(app: str) -> dict[str, bytes]:
    """Contents of every ``.py`` file under the app dir (skills' tools excluded)."""
    out = {}
    for root, dirs, files in os.walk(app):
        dirs[:] = [d for d in dirs if d not in ("__pycache__", "skills")]
        for f in files:
            if f.endswith(".py"):
                p = os.path.join(root, f)
                try:
                    with open(p, "rb") as fh:
                        out[p] = fh.read()
                except OSError:
                    pass
    return out


def compiles(path: str) -> bool:
    """Does the file still compile? ``py_compile``'s check, by the built-in ``compile`` as it calls it: without
    importing ``py_compile`` and ``tempfile`` or writing any bytecode (~8 ms of a trial that edits a file)."""
    try:
        with open(path, "rb") as fh:
            compile(fh.read(), path, "exec", dont_inherit=True)
        return True
    except Exception:  # noqa: BLE001 - a SyntaxError, ValueError, RecursionError, MemoryError or OSError: no
        return False


def skill_names(app: str) -> list[str]:
    """The skills in the app dir (``skills/<name>/SKILL.md``), sorted."""
    root = os.path.join(app, "skills")
    if not os.path.isdir(root):
        return []
    return [n for n in sorted(os.listdir(root)) if os.path.isfile(os.path.join(root, n, "SKILL.md"))]


def named_skills(app: str, instruction: str) -> list[str]:
    """The skills whose name appears in the instruction."""
    return [n for n in skill_names(app) if re.search(rf"\b{re.escape(n)}\b", instruction)]


def skill_usages(app: str, instruction: str = "") -> list[str]:
    """``Skill NAME: Usage: ...`` lines of the skills the instruction names — or, when it names none, of
    every skill in the app dir (the harness cannot tell which tool such a task needs)."""
    out = []
    for name in named_skills(app, instruction) or skill_names(app):
        with open(os.path.join(app, "skills", name, "SKILL.md")) as fh:
            for line in fh:
                if line.startswith("Usage:"):
                    out.append(f"Skill {name}: {line.strip()}")
    return out


# --- the loop --------------------------------------------------------------------------------------


class Agent:
    def __init__(self, cfg: dict, client: Client, model: str, instruction: str, system: str, app: str, seed: int):
        self.cfg, self.client, self.model, self.app, self.seed = cfg, client, model, app, seed
        self.instruction = instruction
        self.shell = Shell(app, bool(cfg["shell"]["persistent"]), float(cfg["agent"]["command_timeout_sec"]))
        self.steps: list[dict] = []
        self.usage = {"prompt_tokens": 0, "completion_tokens": 0, "requests": 0}
        self.signals = {"lost_cd": 0, "broken_edit": 0, "repeats": 0, "skills_present": bool(skill_names(app)),
                        "skills_named": bool(named_skills(app, instruction)), "skill_seen": False,
                        "check_available": os.path.isfile(os.path.join(app, "check.sh")),
                        "verified": False, "truncations": 0, "reverted_edits": 0, "loop_resamples": 0,
                        "verify_failures": 0}
        user = instruction
        if cfg["skills"]["load_skills"]:
            usages = skill_usages(app, instruction)
            if usages:
                user = instruction + "\n" + "\n".join(usages)
                self.signals["skill_seen"] = True
        self.messages = ([{"role": "system", "content": system}] if system.strip() else []) + [{"role": "user", "content": user}]

    def ask(self, turn: int, retry: int, temperature: float, max_tokens: int) -> dict:
        reply = self.client.chat(self.model, self.messages, max_tokens=max_tokens, temperature=temperature,
                                 seed=request_seed(self.seed, turn, retry))
        u = reply.get("usage") or {}
        self.usage["prompt_tokens"] += int(u.get("prompt_tokens") or 0)
        self.usage["completion_tokens"] += int(u.get("completion_tokens") or 0)
        self.usage["requests"] += 1
        return reply

    def sample(self, turn: int, step: dict, retry: int = 0, temperature: float | None = None) -> tuple[dict, int]:
        """One reply, with the truncation policy applied → (reply, next retry index)."""
        gen = self.cfg["generation"]
        temp = float(gen["temperature"]) if temperature is None else temperature
        reply = self.ask(turn, retry, temp, int(gen["max_output_tokens"]))
        retry += 1
        if reply["finish_reason"] == "length":
            self.signals["truncations"] += 1
            step["retries"].append({"reason": "truncated", "reply": reply["content"]})
            if gen["on_truncation"] == "continue":
                reply = self.ask(turn, retry, temp, int(gen["continue_max_tokens"]))
                retry += 1
        return reply, retry

    def run(self) -> tuple[str, str]:
        cfg = self.cfg
        last_cmd = None
        max_turns = int(cfg["agent"]["max_turns"])
        for turn in range(max_turns):
            step: dict = {"turn": turn, "n_messages": len(self.messages), "retries": []}
            self.steps.append(step)
            try:
                reply, retry = self.sample(turn, step)
                kind, arg = parse_action(reply["content"])
                # loop detection: the same command again → resample hotter
                if kind == "cmd" and arg == last_cmd:
                    self.signals["repeats"] += 1
                    if cfg["loop"]["detect"]:
                        for _ in range(int(cfg["loop"]["max_resamples"])):
                            step["retries"].append({"reason": "repeat", "reply": reply["content"]})
                            self.signals["loop_resamples"] += 1
                            reply, retry = self.sample(turn, step, retry, float(cfg["loop"]["loop_temperature"]))
                            kind, arg = parse_action(reply["content"])
                            if not (kind == "cmd" and arg == last_cmd):
                                break
            except LLMError as exc:
                step["error"] = str(exc)
                if exc.code == "context_length_exceeded":
                    return "context_full", str(exc)
                return "error", str(exc)
            step.update(reply=reply["content"], finish_reason=reply["finish_reason"], action=kind)
            if reply["finish_reason"] == "length":
                return "truncated", reply["content"]
            if kind == "cmd":
                try:
                    output, code, reply = self.execute(turn, step, arg, reply, retry)
                except LLMError as exc:
                    step["error"] = str(exc)
                    return ("context_full" if exc.code == "context_length_exceeded" else "error"), str(exc)
                if reply["finish_reason"] == "length":
                    return "truncated", reply["content"]
                kind, arg = parse_action(reply["content"])
                if kind != "cmd":  # a resample after a reverted edit answered instead
                    step.update(reply=reply["content"], action=kind)
                else:
                    self.messages.append({"role": "assistant", "content": reply["content"].strip()})
                    self.messages.append({"role": "user", "content": observation(output, code)})
                    last_cmd = arg
                    continue
            if kind in ("answer", "done"):
                self.messages.append({"role": "assistant", "content": reply["content"].strip()})
                if kind == "answer":
                    with open(os.path.join(self.app, "answer.txt"), "w") as fh:
                        fh.write(arg + "\n")
                if cfg["completion"]["verify_before_submit"] and self.signals["check_available"]:
                    out, code = self.check_script()
                    ok = code == 0
                    step["verify"] = {"ok": ok, "output": out[-OUT_BYTES:]}
                    if not ok:
                        self.signals["verify_failures"] += 1
                        self.messages.append({"role": "user", "content": observation("check failed: " + out.strip(), 0)})
                        continue
                    self.signals["verified"] = True
                return kind, arg
            # invalid reply: say what is expected and go on
            self.messages.append({"role": "assistant", "content": reply["content"].strip()[:200]})
            self.messages.append({"role": "user", "content": "OUT: reply with $ <command>, ANSWER: <answer> or DONE"})
        return "max_turns", ""

    def check_script(self) -> tuple[str, int]:
        """Run the task's visible ``check.sh`` → (output, exit code)."""
        import subprocess  # see Shell.run

        try:
            proc = subprocess.run(["bash", "check.sh"], cwd=self.app, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, timeout=30)
            return proc.stdout.decode("utf-8", "replace"), proc.returncode
        except subprocess.TimeoutExpired:
            return "check timed out", 124

    def execute(self, turn: int, step: dict, command: str, reply: dict, retry: int) -> tuple[str, int, dict]:
        """Run a command; with ``[edits] check`` revert and resample edits that break a ``.py`` file."""
        check = bool(self.cfg["edits"]["check"])
        for attempt in range(int(self.cfg["edits"]["max_resamples"]) + 1):
            before = py_files(self.app)
            if re.match(r"\s*cd(\s|$)", command) and not self.cfg["shell"]["persistent"]:
                self.signals["lost_cd"] += 1
            if "SKILL.md" in command:
                self.signals["skill_seen"] = True
            output, code = self.shell.run(command)
            cwd = os.path.relpath(self.shell.cwd, self.app)  # the session's directory after it (fresh shells: ".")
            after = py_files(self.app)
            changed = [p for p, c in after.items() if before.get(p) != c]
            broken = [p for p in changed if not compiles(p)]
            step.setdefault("commands", []).append({"command": command, "cwd": cwd, "exit_code": code, "output": output[:1000],
                                                    "changed": [os.path.relpath(p, self.app) for p in changed],
                                                    "broken": [os.path.relpath(p, self.app) for p in broken]})
            if not broken:
                return output, code, reply
            if not check:
                self.signals["broken_edit"] += 1
                return output, code, reply
            for p in changed:  # revert, then ask again
                with open(p, "wb") as fh:
                    fh.write(before[p])
            self.signals["reverted_edits"] += 1
            if attempt == int(self.cfg["edits"]["max_resamples"]):
                return "edit reverted: the file no longer compiled", 1, reply
            step["retries"].append({"reason": "broken_edit", "reply": reply["content"]})
            reply, retry = self.sample(turn, step, retry)
            kind, arg = parse_action(reply["content"])
            if kind != "cmd" or reply["finish_reason"] == "length":
                return "", 0, reply
            command = arg
        return output, code, reply


def failure_label(trajectory: dict, reward: float) -> str | None:
    """The failure mode of an attempt (None when it scored); see the module docstring."""
    if reward >= 1:
        return None
    end, s = trajectory.get("end_reason"), trajectory.get("signals") or {}
    if end == "error":
        return "harness_error"
    if end == "truncated":
        return "truncated_output"
    if end in ("max_turns", "context_full") and s.get("repeats", 0) >= 1:
        return "action_loop"
    if s.get("lost_cd"):
        return "lost_shell_state"
    if s.get("broken_edit"):
        return "unchecked_edit"
    if s.get("skills_named", s.get("skills_present")) and not s.get("skill_seen"):
        return "missing_skill"
    if end in ("done", "answer") and s.get("check_available") and not s.get("verified"):
        return "unverified_completion"
    return "wrong_answer"


def main() -> int:
    harness_dir = os.environ.get("RSIGYM_HARNESS_DIR", HERE)
    app = os.environ.get("RSIGYM_APP_DIR", "/app")
    logs = os.environ.get("RSIGYM_LOGS_DIR", "/logs/agent")
    os.makedirs(logs, exist_ok=True)
    t0 = time.monotonic()
    traj: dict = {"model": os.environ.get("RSIGYM_MODEL", ""), "seed": int(os.environ.get("RSIGYM_SEED", "0") or 0)}
    agent = None
    try:
        cfg = load_config(os.path.join(harness_dir, "harness.toml"))
        traj["config"] = cfg
        prompt_path = os.path.join(harness_dir, "prompt.md")
        system = open(prompt_path).read().strip() if os.path.exists(prompt_path) else ""
        inst_file = os.environ.get("RSIGYM_INSTRUCTION_FILE", os.path.join(app, "instruction.md"))
        with open(inst_file) as fh:
            instruction = fh.read().strip()
        agent = Agent(cfg, Client.from_env(), traj["model"], instruction, system, app, traj["seed"])
        end, detail = agent.run()
    except Exception as exc:  # noqa: BLE001 - every failure is recorded, never raised past the trial
        end, detail = "error", f"{type(exc).__name__}: {exc}"
    if agent is not None:
        agent.shell.close()
        traj.update(steps=agent.steps, messages=agent.messages, signals=agent.signals, usage=agent.usage)
    traj.update(end_reason=end, detail=detail[:500], seconds=round(time.monotonic() - t0, 3))
    with open(os.path.join(logs, "trajectory.json"), "w") as fh:
        json.dump(traj, fh, indent=1)
    return 0 if end != "error" else 1


if __name__ == "__main__":
    sys.exit(main())
