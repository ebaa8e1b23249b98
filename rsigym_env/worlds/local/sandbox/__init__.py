"""The local world's sandbox: bubblewrap isolation (:mod:`.isolation`), a server speaking E2B's envd
protocol over it (:mod:`.envd`), the sandbox service the researcher's commands reach through the
``e2b`` SDK (:mod:`.service`), and the harness's bytecode compiled in a sandbox (:mod:`.harness_bytecode`,
installed on import)."""

from . import harness_bytecode  # noqa: F401  (installs the sandboxed compiler of the harness's bytecode)
