"""The local world's language model stack: the NumPy transformer (:mod:`.model`)."""
