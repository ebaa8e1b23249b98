"""RSIGym-Env: each research run is a Gymnasium environment.

Importing the package registers ``RSIGym/Joint-v0``, ``RSIGym/Data-v0`` and ``RSIGym/Harness-v0``:

>>> import gymnasium as gym, rsigym_env
>>> env = gym.make("RSIGym/Data-v0", world="sim", benchmark="gpqa-diamond", budget_usd=500)
>>> env.unwrapped.scenario.track
'data'
>>> [s["function"]["name"] for s in rsigym_env.tool_schemas()][:3]
['generate_data', 'transform_data', 'train']
"""

from __future__ import annotations

from .numerics import pin_blas_core as _pin_blas_core

_pin_blas_core()  # the same OpenBLAS kernels on every machine, before anything loads NumPy (numerics.py)

from gymnasium.envs.registration import register, registry  # noqa: E402

from .catalog import ENV_IDS, TRACK_ENV_IDS  # noqa: E402
from .env import ResearchEnv  # noqa: E402
from .errors import ActionError  # noqa: E402
from .scenario import Scenario, list_scenarios, load_scenario  # noqa: E402
from .scoring import normalized_gain, rsi_index  # noqa: E402
from .tools import TOOLS, action_space, parse_action, tool_schemas  # noqa: E402
from .researchers import Researchers as _Researchers, spec_id as _spec_id  # noqa: E402
from .worlds.recursive.ports import use_researchers as _use_researchers  # noqa: E402
from .archive import use_identity as _use_identity  # noqa: E402

__all__ = [
    "ENV_IDS", "TOOLS", "ActionError", "ResearchEnv", "Scenario", "action_space", "list_scenarios",
    "load_scenario", "normalized_gain", "parse_action", "rsi_index", "tool_schemas",
]
__version__ = "0.1.0"

for _track, _env_id in TRACK_ENV_IDS.items():
    if _env_id not in registry:
        # The env enforces its own step, time and money limits (the initial system then counts as
        # submitted), so no TimeLimit wrapper is added here.
        register(id=_env_id, entry_point="rsigym_env.env:ResearchEnv",
                 vector_entry_point="rsigym_env.vector:make_vector_env", kwargs={"track": _track})

_use_researchers(_Researchers())  # what the recursive world needs from the researcher layer (it may not import it)
_use_identity(_spec_id)  # archive nodes are identified by their spec's id (the archive may not import agents either)
