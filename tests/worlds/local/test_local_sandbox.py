"""LocalSandboxService: the sandbox_exec service of the local world (e2b SDK → local envd → bubblewrap)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Iterator

import pytest

pytest.importorskip("e2b")

from rsigym_env.prices import DEFAULT_PRICES  # noqa: E402
from rsigym_env.services import SandboxService  # noqa: E402
from rsigym_env.tools import SandboxExec  # noqa: E402
from rsigym_env.worlds.local.sandbox.isolation import WALL_EXIT, bwrap_available  # noqa: E402
from rsigym_env.worlds.local.sandbox.service import LocalSandboxService  # noqa: E402

pytestmark = pytest.mark.skipif(not bwrap_available(), reason="bubblewrap is not usable here")


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSandboxService]:
    with LocalSandboxService(tmp_path_factory.mktemp("run")) as svc:
        yield svc


def test_it_is_a_sandbox_service_that_bills_per_second(service: LocalSandboxService) -> None:
    assert isinstance(service, SandboxService)
    call = SandboxExec(command="echo hi; echo warn >&2; exit 4", timeout_s=30)
    quote = service.quote(call)
    rate = 2 * DEFAULT_PRICES.sandbox.vcpu_second + 2 * DEFAULT_PRICES.sandbox.gib_second
    assert quote.usd == pytest.approx(30 * rate) and quote.seconds == 30
    billed = service.exec(call)
    r = billed.value
    assert (r.stdout, r.stderr, r.exit_code) == ("hi\n", "warn\n", 4)
    assert 0 < r.duration_s < 5 and billed.cost_usd == pytest.approx(r.duration_s * rate)
    assert billed.cost_usd <= quote.usd


def test_state_persists_in_app_between_calls(service: LocalSandboxService) -> None:
    service.exec(SandboxExec(command="mkdir -p proj && echo 'print(6 * 7)' > proj/main.py"))
    r = service.exec(SandboxExec(command="cd proj && python3 main.py && pwd")).value
    assert r.stdout == "42\n/app/proj\n"
    assert (service.app_dir / "proj" / "main.py").exists()
    assert service.exec(SandboxExec(command="pwd")).value.stdout == "/app\n"  # every call starts in /app


@pytest.mark.slow
def test_timeout_returns_output_exit_124_and_bills_at_most_the_quote(service: LocalSandboxService) -> None:
    call = SandboxExec(command="echo started; sleep 30", timeout_s=1)
    billed = service.exec(call)
    r = billed.value
    assert r.exit_code == WALL_EXIT and r.stdout == "started\n"
    assert "[sandbox] wall-clock limit (1 s) reached" in r.stderr
    assert 0.9 < r.duration_s < 3 and billed.cost_usd <= service.quote(call).usd


def test_run_script_moves_files_in_and_out(service: LocalSandboxService, tmp_path: Path) -> None:
    host_input = tmp_path / "in_1.jsonl"
    host_input.write_text('{"q": 2}\n')
    job = service.run_script(
        "cat /data/in_0.jsonl /data/in_1.jsonl | sort > /data/out.jsonl; wc -l < /data/out.jsonl; ls /app",
        inputs={"/data/in_0.jsonl": '{"q": 1}\n', "/data/in_1.jsonl": host_input},
        outputs=["/data/out.jsonl", "/data/missing.jsonl"], timeout_s=30)
    assert job.result.exit_code == 0 and job.result.stdout == "2\n"
    assert job.outputs == {"/data/out.jsonl": b'{"q": 1}\n{"q": 2}\n'}
    assert 0 < job.cost_usd <= service.quote_script(30).usd
    assert not any((service.dir / "jobs").iterdir())  # the job's directories are gone
    assert not (service.app_dir / "data").exists()  # and it never touched the run's sandbox
    # inputs given positionally, relative paths under /app, and the result unpacks as (result, outputs)
    result, outputs = service.run_script("python3 tool.py < data/in.txt > data/out.txt",
                                         {"data/in.txt": b"3\n", "tool.py": "print(int(input()) * 2)"},
                                         outputs=["data/out.txt"], timeout_s=30)
    assert result.exit_code == 0 and outputs == {"data/out.txt": b"6\n"}


def test_network_switch(tmp_path: Path) -> None:
    host = socket.socket()
    host.bind(("127.0.0.1", 0))
    host.listen(1)
    port = host.getsockname()[1]
    probe = f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 2); print('reached')\""
    try:
        with LocalSandboxService(tmp_path / "off") as off, LocalSandboxService(tmp_path / "on", network=True) as on:
            r_off = off.exec(SandboxExec(command=probe)).value
            r_on = on.exec(SandboxExec(command=probe)).value
    finally:
        host.close()
    assert r_off.exit_code == 1 and "ConnectionRefusedError" in r_off.stderr
    assert r_on.exit_code == 0 and r_on.stdout == "reached\n"


def test_close_stops_the_server(tmp_path: Path) -> None:
    svc = LocalSandboxService(tmp_path)
    assert svc.server.running
    svc.close()
    assert not svc.server.running
    svc.close()  # twice is fine


def test_refuses_to_start_without_isolation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rsigym_env.worlds.local.sandbox import isolation, service as sandbox

    monkeypatch.setattr(sandbox, "bwrap_available", lambda: False)
    with pytest.raises(isolation.IsolationUnavailable, match="bubblewrap"):
        LocalSandboxService(tmp_path)


def test_a_command_exiting_124_by_itself_is_not_a_timeout(service: LocalSandboxService) -> None:
    r = service.exec(SandboxExec(command="exit 124", timeout_s=30)).value
    assert r.exit_code == 124 and "wall-clock" not in r.stderr
