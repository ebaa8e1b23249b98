"""What every world that runs real services shares (the local and the remote world wire it up).

Nothing here imports a concrete world (``lint-imports`` checks it):

* :mod:`.datasets`: a run's datasets on disk (chat JSONL, bounded, streamed statistics);
* :mod:`.tokenizer`, :mod:`.training`: chat renderers and the supervised loop over any Tinker-interface
  client (the local ``LocalServiceClient`` or ``tinker.ServiceClient``);
* :mod:`.evaluation`, :mod:`.harbor_agent`: evaluations as Harbor ``Job`` s, the harness as a Harbor agent;
* :mod:`.harness`: the minimal harness (the initial system's code).
"""
