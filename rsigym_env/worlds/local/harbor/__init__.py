"""The local world's Harbor pieces: trials in bubblewrap sandboxes (:mod:`.environment`)."""
