"""The local world's language model stack: the NumPy transformer (:mod:`.model`), the Tinker-shaped client
over it (:mod:`.tinker_client`), checkpoints as servable chat models (:mod:`.chat`), sampling worker
processes (:mod:`.inference_pool`) and the shipped base checkpoint (:mod:`.base`)."""
