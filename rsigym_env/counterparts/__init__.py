"""Local services that speak the providers' protocols, so the remote world runs unchanged, offline.

* :mod:`.tinker_api` — Tinker's HTTP API (``/api/v1/...``) over the local model stack
  (``TINKER_BASE_URL``, ``TINKER_API_KEY``);
* :mod:`.e2b_api` — E2B's control plane (``E2B_API_URL``) handing out bubblewrap sandboxes served by the local
  envd, reached through one sandbox router (``E2B_SANDBOX_URL``);
* :mod:`.stack` — all of them plus the OpenAI-compatible server (inference at ``…/oai/api/v1``, teachers at
  ``RSIGYM_TEACHER_BASE_URL``): ``rsigym counterparts``.

What they prove and what they cannot: ``docs/remote.md``.
"""

DEFAULT_MODEL_ID = "Qwen/Qwen3.5-9B-Base"   # a base model in Tinker's price list; the local base answers as it
DEFAULT_BASE = "rsigym-base"                # the shipped pretrained local base model
DEFAULT_BENCHMARK = "aime"                  # whose local tasks RSIGYM_REMOTE_TASKS holds

__all__ = ["DEFAULT_BASE", "DEFAULT_BENCHMARK", "DEFAULT_MODEL_ID"]
