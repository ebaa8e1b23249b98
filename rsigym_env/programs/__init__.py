"""Program researchers: a researcher whose behaviour is Python source files (``code``) plus scalar
``params``, run in a sandbox of its own and reached only through ``reset``/``act`` messages.

:mod:`.runtime` is the side inside the sandbox (standard library only: it runs under the bare base
interpreter) and :func:`load_program` (also for trusted code in this process); :mod:`.sandbox` is the
host side: :class:`ProgramResearcher`, its :class:`ProgramLimits`, the pool of live sandboxes and
:class:`ProgramError`. ``seed/`` holds the bundled seed program.
"""

from .runtime import load_program
from .sandbox import ProgramError, ProgramLimits, ProgramPool, ProgramResearcher

__all__ = ["ProgramError", "ProgramLimits", "ProgramPool", "ProgramResearcher", "load_program"]
