"""The local world's Harbor pieces: trials in bubblewrap sandboxes (:mod:`.environment`) and the local world's
evaluation service, the shared Harbor one on them (:mod:`.evaluation`). The harness as a Harbor agent is shared
with the remote world (:mod:`rsigym_env.worlds.common.harbor_agent`)."""
