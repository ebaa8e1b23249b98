"""The local world's sandbox: bubblewrap isolation (:mod:`.isolation`), a server speaking E2B's envd
protocol over it (:mod:`.envd`), and the sandbox service the researcher's commands reach through the
``e2b`` SDK (:mod:`.service`)."""
