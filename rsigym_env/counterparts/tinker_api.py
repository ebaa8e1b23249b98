"""A local service speaking Tinker's HTTP API, so the unchanged ``tinker`` SDK trains and samples the local model.

Point the SDK at it with ``TINKER_BASE_URL`` (and ``TINKER_API_KEY``, the counterpart's ``tml-…`` token). What
tinker 0.38's ``ServiceClient``, ``TrainingClient`` and ``SamplingClient`` call, as they call it:

========================================== =================================================================
``POST /api/v1/client/config``             feature flags: API-key auth, httpx transport, JSON/proto as below
``POST /api/v1/client/dynamic_config``     defaults
``POST /api/v1/create_session``            a session id; ``session_heartbeat`` keeps it (410 once closed)
``GET  /api/v1/healthz``                   ``{"status": "ok"}`` (no key needed)
``GET  /api/v1/get_server_capabilities``   the served base models (Tinker ids) and their context
``POST /api/v1/create_model``              a LoRA training model → future of ``CreateModelResponse``
``POST /api/v1/load_weights``              a training model from a ``tinker://…/weights/…`` state (with optimizer)
``POST /api/v1/get_info``                  ``GetInfoResponse`` (``tokenizer_id``: a local Hugging Face directory)
``POST /api/v1/forward_backward``          protobuf request (the SDK's own ``tinker_public_pb2``) → future
``POST /api/v1/optim_step``                → future of ``OptimStepResponse``
``POST /api/v1/save_weights(_for_sampler)`` → future of the ``tinker://`` path
``POST /api/v1/create_sampling_session``   a sampling session over a checkpoint or a base model
``POST /api/v1/asample``                   → future of ``SampleResponse`` (protobuf, as the SDK asks)
``POST /api/v1/retrieve_future``           the result, ``try_again`` while it runs (after a bounded long
                                           poll), or ``{"error", "category"}`` when it failed
``POST /api/v1/cancel_future``             accepted (work already queued finishes)
``POST /api/v1/telemetry``                 accepted and dropped
``/oai/api/v1/...``                        Tinker's OpenAI-compatible endpoint (``Authorization: Bearer`` the
                                           key): each base model by its Tinker id, each saved checkpoint by its
                                           ``tinker://…/sampler_weights/…`` path (found on first use)
========================================== =================================================================

Also ``GET /api/v1/samplers/{id}`` (a sampling session's base model and path), ``POST
/api/v1/sessions/{id}/finish`` (``ServiceClient`` on close) and ``GET /api/v1/training_runs/{id}/checkpoints``
(``RestClient.list_checkpoints``, one page).

Every JSON body is validated with the SDK's own request type (``tinker.types.*Request``), the protobuf one is
decoded with the SDK's own ``tinker_public_pb2`` into a ``ForwardBackwardRequest``; a malformed request gets
400 ``{"detail": …}`` naming the problem, a call this counterpart does not implement 400 naming it (the SDK
raises ``BadRequestError`` with that text), an unknown route 404, a wrong key 401. Work runs in the local
stack (:class:`~rsigym_env.worlds.local.lm.tinker_client.LocalServiceClient`: one worker per training model,
requests in submission order), never on the event loop; a failure becomes the future's
``RequestFailedResponse`` (``category`` ``user`` for a bad request, ``server`` otherwise), never silence.

The base model served is the local one, registered under a Tinker model id (``models``): the counterpart proves
the wire protocol and the remote world's code, not Tinker's models.
"""

from __future__ import annotations

import concurrent.futures as cf
import itertools
import logging
import secrets
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable, Mapping

import anyio
import anyio.to_thread
import numpy as np
from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route
from tinker import types
from tinker.proto import tinker_public_pb2 as pb
from tinker.proto.response_conv import _tensor_data_from_proto

from ..errors import ActionError
from ..serving.asgi import HTTPServing, ThreadedASGIServer
from ..serving.models import ModelRegistry, RegisteredModel
from ..serving.openai_server import UsageMeter, create_app, error_response

log = logging.getLogger("rsigym_env.counterparts.tinker")

LONG_POLL_S = 20.0        # retrieve_future waits at most this long before answering try_again
MAX_FUTURES = 10_000      # finished futures kept for retrieval (oldest dropped first)
PROTO = "application/x-protobuf"


class Unsupported(Exception):
    """A call the counterpart does not implement (400 naming it)."""


def bearer_guard(app: Any, token: str) -> Any:
    """``app`` behind ``Authorization: Bearer <token>`` (401 in OpenAI's error shape otherwise)."""
    expected = f"Bearer {token}".encode()

    async def guarded(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and dict(scope.get("headers", [])).get(b"authorization") != expected:
            await error_response(401, "invalid API key (Authorization: Bearer ...)", "authentication_error",
                                 code="invalid_api_key")(scope, receive, send)
            return
        await app(scope, receive, send)

    return guarded


def new_api_key() -> str:
    """A fresh Tinker-shaped key (``tml-`` + 32 random hex digits).

    >>> key = new_api_key(); key.startswith("tml-"), len(key)
    (True, 36)
    """
    return "tml-" + secrets.token_hex(16)


# ---- protobuf ----------------------------------------------------------------------------------


def forward_backward_request_from_proto(body: bytes) -> tuple[types.ForwardBackwardRequest, bool]:
    """The SDK's ``ForwardBackwardRequest`` (and ``forward_only``) from its protobuf encoding
    (the inverse of ``tinker.proto.request_conv.forward_backward_request_to_proto``)."""
    msg = pb.ForwardBackwardRequest()
    msg.ParseFromString(body)
    data = []
    for d in msg.data:
        chunks: list[Any] = []
        for c in d.model_input:
            kind = c.WhichOneof("chunk")
            if kind != "encoded_text":
                raise Unsupported(f"model input chunks of type {kind!r} (only encoded text is served here)")
            chunks.append(types.EncodedTextChunk(tokens=np.frombuffer(c.encoded_text.tokens, np.int32).tolist()))
        if len(d.model_input_spans) or len(d.loss_fn_input_spans):
            raise Unsupported("provenance spans (StableReinforce)")
        inputs = {name: _tensor_data_from_proto(t) for name, t in d.loss_fn_inputs.items()}
        data.append(types.Datum(model_input=types.ModelInput(chunks=chunks), loss_fn_inputs=inputs))
    config: dict[str, Any] = {k: v for k, v in msg.loss_fn_config.items()}
    for k, v in msg.loss_fn_config_v2.items():
        config[k] = v.text if v.WhichOneof("value") == "text" else v.number
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=data, loss_fn=msg.loss_fn, loss_fn_config=config or None),
        model_id=msg.model_id, seq_id=msg.seq_id)
    return request, msg.forward_only


def _batched(arrays: list[np.ndarray], dtype: str) -> pb.BatchedTensor:
    np_dtype = np.float32 if dtype == "float32" else np.int64
    flat = [np.ascontiguousarray(a, dtype=np_dtype).reshape(-1) for a in arrays]
    offsets = np.cumsum([0] + [f.nbytes for f in flat]).astype(np.int64)
    trailing = list(arrays[0].shape[1:]) if arrays and arrays[0].ndim > 1 else []
    return pb.BatchedTensor(data=b"".join(f.tobytes() for f in flat), offsets=offsets.tobytes(),
                            dtype=pb.DTYPE_FLOAT32 if dtype == "float32" else pb.DTYPE_INT64, trailing_shape=trailing)


def forward_backward_output_to_proto(out: types.ForwardBackwardOutput) -> bytes:
    """``ForwardBackwardOutput`` → the protobuf the SDK decodes (``response_conv.deserialize_forward_backward_output``)."""
    record = pb.ArrayRecord(type_tag=out.loss_fn_output_type, num_datums=len(out.loss_fn_outputs))
    names = list(out.loss_fn_outputs[0]) if out.loss_fn_outputs else []
    for name in names:
        tensors = [d[name] for d in out.loss_fn_outputs]
        arrays = [t.to_numpy().reshape(t.shape) if t.shape else t.to_numpy() for t in tensors]
        record.fields[name].CopyFrom(_batched(arrays, tensors[0].dtype))
    msg = pb.ForwardBackwardOutput(loss_fn_output_type=out.loss_fn_output_type,
                                   metrics={k: float(v) for k, v in out.metrics.items()})
    if out.loss_fn_outputs:
        msg.loss_fn_outputs.append(record)
    return msg.SerializeToString()


_STOP = {"stop": pb.STOP_REASON_STOP, "length": pb.STOP_REASON_LENGTH}


def sample_response_to_proto(resp: types.SampleResponse) -> bytes:
    """``SampleResponse`` → the protobuf the SDK decodes (``response_conv.deserialize_sample_response``).

    >>> from tinker.proto.response_conv import deserialize_sample_response
    >>> seq = types.SampledSequence(stop_reason="stop", sequence_id="s", tokens_np=np.array([7, 8], np.int32))
    >>> back = deserialize_sample_response(sample_response_to_proto(types.SampleResponse(sequences=[seq])))
    >>> list(back.sequences[0].tokens), back.sequences[0].stop_reason
    ([7, 8], 'stop')
    """
    msg = pb.SampleResponse()
    for seq in resp.sequences:
        s = msg.sequences.add()
        s.stop_reason = _STOP[seq.stop_reason]
        s.tokens = np.asarray(list(seq.tokens), np.int32).tobytes()
        if seq.logprobs is not None:
            s.logprobs = np.asarray(list(seq.logprobs), np.float32).tobytes()
    if resp.prompt_logprobs is not None:
        msg.prompt_logprobs = np.asarray([np.nan if v is None else v for v in resp.prompt_logprobs], np.float32).tobytes()
    return msg.SerializeToString()


# ---- the service -------------------------------------------------------------------------------


def _then(future: cf.Future, fn: Callable[[Any], Any]) -> cf.Future:
    """A future of ``fn(future.result())``."""
    out: cf.Future = cf.Future()

    def done(f: cf.Future) -> None:
        try:
            out.set_result(fn(f.result()))
        except BaseException as exc:  # noqa: BLE001 - the failure is the future's result
            out.set_exception(exc)

    future.add_done_callback(done)
    return out


def _concurrent(future: Any) -> cf.Future:
    """The ``concurrent.futures.Future`` behind a local client's future."""
    return future.future() if hasattr(future, "future") and callable(future.future) else future


def _user_error(exc: BaseException) -> bool:
    return isinstance(exc, (ActionError, ValueError, KeyError, FileExistsError, FileNotFoundError, Unsupported,
                            ValidationError))


class CheckpointRegistry(ModelRegistry):
    """The models of Tinker's OpenAI-compatible endpoint: each served base model by its Tinker id and each saved
    sampler checkpoint by its ``tinker://`` path, registered on first use (an unknown path is a 404)."""

    def __init__(self, service: Any, bases: list[str]):
        super().__init__()
        self.service, self.bases = service, list(bases)
        self._adding = threading.Lock()

    def entry(self, name: str) -> RegisteredModel | None:
        from ..worlds.local.lm.chat import register_base, register_checkpoint

        found = super().entry(name)
        if found is None and (name in self.bases or name.startswith("tinker://")):
            with self._adding:
                if name not in self:
                    try:
                        if name in self.bases:
                            register_base(self, self.service, name)
                        else:
                            register_checkpoint(self, self.service, name)
                    except (ActionError, ValueError):
                        return None
            found = super().entry(name)
        return found


class TinkerCounterpart(HTTPServing):
    """Tinker's HTTP API on ``host:port`` over a :class:`LocalServiceClient` in ``root`` (see the module docstring).

    ``models`` maps each Tinker model id served to a registered local base model
    (``tinker_client.register_base_model``); ``api_key`` is the token clients must send (default: a new one).
    """

    def __init__(self, root: str | Path, models: Mapping[str, str], *, api_key: str | None = None,
                 host: str = "127.0.0.1", port: int = 0, long_poll_s: float = LONG_POLL_S):
        from ..worlds.local.lm import tinker_client

        self.root = Path(root)
        self.api_key = api_key or new_api_key()
        if not self.api_key.startswith("tml-"):
            raise ValueError("a Tinker API key starts with 'tml-'")
        self.long_poll_s = long_poll_s
        self.models: dict[str, str] = dict(models)
        for tinker_id, local in self.models.items():
            if tinker_id != local:  # serve the local base under the Tinker id (checkpoints then record that id)
                tinker_client.register_base_model(tinker_id, tinker_client.base_model_source(local))
        self.service = tinker_client.LocalServiceClient(root_dir=self.root / "tinker")
        self._tokenizers: dict[str, str] = {}
        self._lock = threading.Lock()
        self._sessions: dict[str, bool] = {}              # session id -> open
        self._training: dict[str, Any] = {}               # model id -> LocalTrainingClient
        self._sampling: dict[str, tuple[Any, str, str | None]] = {}  # session id -> (client, base model, path)
        self._futures: OrderedDict[str, tuple[cf.Future, str]] = OrderedDict()
        self._ids = itertools.count(1)
        self.oai_registry = CheckpointRegistry(self.service, sorted(self.models))
        self.usage = UsageMeter()  # tokens served by the OpenAI-compatible endpoint, per model id
        self._http = ThreadedASGIServer(self._app(), host=host, port=port, name="tinker")

    @property
    def oai_base_url(self) -> str:
        """Tinker's OpenAI-compatible endpoint here (``{TINKER_BASE_URL}/oai/api/v1``)."""
        return f"{self.url}/oai/api/v1"

    # ---- plumbing ------------------------------------------------------------------------------

    def _app(self) -> Starlette:
        posts: dict[str, Callable[[Request], Any]] = {
            "client/config": self._client_config, "client/dynamic_config": self._dynamic_config,
            "create_session": self._create_session, "session_heartbeat": self._heartbeat,
            "create_model": self._create_model, "load_weights": self._load_weights, "get_info": self._get_info,
            "forward_backward": self._forward_backward, "optim_step": self._optim_step,
            "save_weights": self._save_weights, "save_weights_for_sampler": self._save_for_sampler,
            "create_sampling_session": self._create_sampling_session, "asample": self._asample,
            "retrieve_future": self._retrieve, "cancel_future": self._cancel, "telemetry": self._telemetry,
        }
        gets: dict[str, Callable[[Request], Any]] = {
            "healthz": self._health, "get_server_capabilities": self._capabilities,
        }

        async def dispatch(request: Request) -> Response:
            name = request.path_params["name"]
            table = posts if request.method == "POST" else gets
            if name != "healthz" and request.headers.get("x-api-key") != self.api_key:
                return JSONResponse({"detail": "invalid or missing API key (X-API-Key)"}, status_code=401)
            handler = table.get(name)
            parts = name.split("/")
            if request.method == "GET" and len(parts) == 2 and parts[0] == "samplers":
                handler = self._sampler
            elif request.method == "POST" and len(parts) == 3 and parts[0] == "sessions" and parts[2] == "finish":
                handler = self._finish
            elif request.method == "GET" and len(parts) == 3 and parts[0] == "training_runs" and parts[2] == "checkpoints":
                handler = self._checkpoints
            if handler is None:
                return JSONResponse({"detail": f"the Tinker counterpart does not serve {request.method} /api/v1/{name} "
                                               "(not implemented here)"}, status_code=404)
            try:
                return await handler(request)
            except ValidationError as exc:
                return JSONResponse({"detail": f"invalid request to /api/v1/{name}: {exc}"}, status_code=400)
            except Unsupported as exc:
                return JSONResponse({"detail": f"not supported by the Tinker counterpart: {exc}"}, status_code=400)
            except (KeyError, ValueError) as exc:
                return JSONResponse({"detail": f"/api/v1/{name}: {exc}"}, status_code=400)

        oai = bearer_guard(create_app(self.oai_registry, 600.0, self.usage), self.api_key)
        return Starlette(routes=[Route("/api/v1/{name:path}", dispatch, methods=["GET", "POST"]),
                                 Mount("/oai/api", app=oai)])

    async def _body(self, request: Request, model: type[BaseModel]) -> Any:
        return model.model_validate(await request.json())

    def _future(self, future: cf.Future, kind: str, model_id: str | None = None, **extra: Any) -> JSONResponse:
        request_id = f"req-{next(self._ids)}-{secrets.token_hex(4)}"
        with self._lock:
            self._futures[request_id] = (future, kind)
            while len(self._futures) > MAX_FUTURES:
                self._futures.popitem(last=False)
        body = types.UntypedAPIFuture(request_id=request_id, model_id=model_id, **extra)
        return JSONResponse(body.model_dump(mode="json", exclude_none=True))

    def _failed(self, message: str) -> cf.Future:
        f: cf.Future = cf.Future()
        f.set_exception(Unsupported(message))
        return f

    def _training_client(self, model_id: str) -> Any:
        with self._lock:
            tc = self._training.get(model_id)
        if tc is None:
            raise KeyError(f"no training model {model_id!r} in this counterpart")
        return tc

    def _local_base(self, tinker_id: str) -> str:
        if tinker_id not in self.models:
            raise KeyError(f"base model {tinker_id!r} is not served here; served: {', '.join(sorted(self.models))}")
        return tinker_id

    def tokenizer_dir(self, tinker_id: str) -> str:
        """The Hugging Face tokenizer directory reported as ``tokenizer_id`` for ``tinker_id`` (written once)."""
        from .hf_tokenizer import write_hf_tokenizer

        with self._lock:
            if tinker_id not in self._tokenizers:
                base = self.service.base_model(tinker_id)
                safe = tinker_id.replace("/", "__")
                self._tokenizers[tinker_id] = str(write_hf_tokenizer(base.tokenizer, self.root / "tokenizers" / safe))
            return self._tokenizers[tinker_id]

    # ---- session -------------------------------------------------------------------------------

    async def _client_config(self, request: Request) -> Response:
        await self._body(request, types.ClientConfigRequest)
        config = types.ClientConfigResponse(pjwt_auth_enabled=False, use_pyqwest_transport=False,
                                            proto_compress_fwdbwd=False, sample_use_retrieve_futures=False,
                                            custom_loss_server_side=False, sample_join_sampling_session=False)
        return JSONResponse(config.model_dump(mode="json"))

    async def _dynamic_config(self, request: Request) -> Response:
        await self._body(request, types.ClientConfigRequest)
        return JSONResponse(types.ClientDynamicConfigResponse().model_dump(mode="json"))

    async def _create_session(self, request: Request) -> Response:
        await self._body(request, types.CreateSessionRequest)
        session_id = f"session-{secrets.token_hex(6)}"
        with self._lock:
            self._sessions[session_id] = True
        return JSONResponse(types.CreateSessionResponse(session_id=session_id).model_dump(mode="json"))

    async def _heartbeat(self, request: Request) -> Response:
        body = await self._body(request, types.SessionHeartbeatRequest)
        if not self._sessions.get(body.session_id):
            return JSONResponse({"detail": f"session {body.session_id!r} is not open"}, status_code=410)
        return JSONResponse(types.SessionHeartbeatResponse().model_dump(mode="json"))

    async def _finish(self, request: Request) -> Response:
        session_id = request.path_params["name"].split("/")[1]
        await request.body()
        with self._lock:
            if session_id not in self._sessions:
                raise KeyError(f"no session {session_id!r}")
            self._sessions[session_id] = False
            for model_id in [m for m in self._training if m.startswith(f"{session_id}:")]:
                del self._training[model_id]  # its checkpoints stay; its in-memory weights go
        return Response(status_code=200, content=b"null", media_type="application/json")

    async def _checkpoints(self, request: Request) -> Response:
        """``RestClient.list_checkpoints``: the run's saved checkpoints (one page)."""
        import datetime as dt
        import json

        run = request.path_params["name"].split("/")[1]
        with self._lock:  # the SDK's model id names the same run as the one in its tinker:// paths
            tc = self._training.get(run)
        run = tc.model_id if tc is not None else run
        found = []
        for meta in sorted((self.service.root_dir / "runs" / run).glob("*/*/meta.json")):
            kind, name = meta.parent.parent.name, meta.parent.name
            if kind not in ("weights", "sampler_weights"):
                continue
            info = json.loads(meta.read_text())
            found.append(types.Checkpoint(
                checkpoint_id=f"{kind}/{name}", checkpoint_type="training" if kind == "weights" else "sampler",
                time=dt.datetime.fromtimestamp(meta.stat().st_mtime, dt.timezone.utc),
                tinker_path=f"tinker://{run}/{kind}/{name}", user_metadata=info.get("user_metadata") or None,
                size_bytes=sum(f.stat().st_size for f in meta.parent.iterdir())))
        reply = types.CheckpointsListResponse(checkpoints=found)
        return JSONResponse(reply.model_dump(mode="json", exclude_none=True))

    async def _health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def _capabilities(self, request: Request) -> Response:
        models = []
        for tinker_id in sorted(self.models):
            base = await anyio.to_thread.run_sync(self.service.base_model, tinker_id)
            models.append(types.SupportedModel(model_name=tinker_id, max_context_length=base.config.max_seq_len,
                                               trainable=True, sampleable=True))
        return JSONResponse(types.GetServerCapabilitiesResponse(supported_models=models).model_dump(mode="json"))

    async def _telemetry(self, request: Request) -> Response:
        await self._body(request, types.TelemetrySendRequest)
        return JSONResponse(types.TelemetryResponse(status="accepted").model_dump(mode="json"))

    async def _cancel(self, request: Request) -> Response:
        body = await request.json()  # the SDK sends {"request_id"} (no request type of its own)
        if not isinstance(body, dict) or not isinstance(body.get("request_id"), str):
            raise ValueError("cancel_future needs {'request_id': str}")
        return Response(status_code=200, content=b"null", media_type="application/json")

    # ---- training ------------------------------------------------------------------------------

    async def _create_model(self, request: Request) -> Response:
        body: types.CreateModelRequest = await self._body(request, types.CreateModelRequest)
        base = self._local_base(body.base_model)
        if not isinstance(body.optimizer_config, types.AdamOptimizerConfig):
            raise Unsupported(f"optimizer {type(body.optimizer_config).__name__} (Adam only)")
        lora = body.lora_config or types.LoraConfig(rank=32)
        model_id = f"{body.session_id}:train:{body.model_seq_id}"
        created = self.service.create_lora_training_client(
            base_model=base, rank=lora.rank, seed=lora.seed, train_mlp=lora.train_mlp, train_attn=lora.train_attn,
            train_unembed=lora.train_unembed,
            user_metadata={str(k): str(v) for k, v in (body.user_metadata or {}).items()})

        def register(tc: Any) -> types.CreateModelResponse:
            with self._lock:
                self._training[model_id] = tc
            return types.CreateModelResponse(model_id=model_id)

        return self._future(_then(_concurrent(created), register), "CreateModel", model_id)

    async def _load_weights(self, request: Request) -> Response:
        body: types.LoadWeightsRequest = await self._body(request, types.LoadWeightsRequest)
        if body.session_id is None or body.model_seq_id is None:
            raise Unsupported("load_weights onto an existing model (only a new model from a checkpoint is served)")
        model_id = f"{body.session_id}:train:{body.model_seq_id}"
        loader = (self.service.create_training_client_from_state_with_optimizer if body.optimizer
                  else self.service.create_training_client_from_state)
        created = await anyio.to_thread.run_sync(lambda: loader(body.path, base_model=body.base_model))

        def register(tc: Any) -> types.LoadWeightsResponse:
            with self._lock:
                self._training[model_id] = tc
            return types.LoadWeightsResponse(path=body.path, model_id=model_id)

        return self._future(_then(_concurrent(created), register), "LoadWeights", model_id)

    async def _get_info(self, request: Request) -> Response:
        body: types.GetInfoRequest = await self._body(request, types.GetInfoRequest)
        tc = self._training_client(body.model_id)
        info: types.GetInfoResponse = tc.get_info()
        tokenizer = await anyio.to_thread.run_sync(self.tokenizer_dir, info.model_data.model_name)
        info = info.model_copy(update={"model_id": body.model_id, "model_data": info.model_data.model_copy(
            update={"tokenizer_id": tokenizer})})
        return JSONResponse(info.model_dump(mode="json", exclude_none=True))

    async def _forward_backward(self, request: Request) -> Response:
        if request.headers.get("content-encoding", "identity") != "identity":
            raise Unsupported(f"Content-Encoding {request.headers['content-encoding']!r} (the client config asks for none)")
        raw = await request.body()
        body, forward_only = forward_backward_request_from_proto(raw)
        tc = self._training_client(body.model_id)
        fb = body.forward_backward_input
        call = tc.forward if forward_only else tc.forward_backward
        try:
            future = _concurrent(call(fb.data, fb.loss_fn, loss_fn_config=fb.loss_fn_config))
        except Exception as exc:  # noqa: BLE001 - refused before queueing: the future fails with the reason
            future = self._failed(f"{type(exc).__name__}: {exc}")
        return self._future(future, "ForwardBackward", body.model_id)

    async def _optim_step(self, request: Request) -> Response:
        body: types.OptimStepRequest = await self._body(request, types.OptimStepRequest)
        if not isinstance(body.optim_params, types.AdamParams):
            raise Unsupported(f"optimizer parameters {type(body.optim_params).__name__} (Adam only)")
        tc = self._training_client(body.model_id)
        return self._future(_concurrent(tc.optim_step(body.optim_params)), "OptimStep", body.model_id)

    async def _save_weights(self, request: Request) -> Response:
        body: types.SaveWeightsRequest = await self._body(request, types.SaveWeightsRequest)
        tc = self._training_client(body.model_id)
        name = body.path or f"state-{next(self._ids)}"
        future = _concurrent(tc.save_state(name, ttl_seconds=body.ttl_seconds, overwrite=body.overwrite,
                                           user_metadata=body.user_metadata))
        return self._future(future, "SaveWeights", body.model_id)

    async def _save_for_sampler(self, request: Request) -> Response:
        body: types.SaveWeightsForSamplerRequest = await self._body(request, types.SaveWeightsForSamplerRequest)
        tc = self._training_client(body.model_id)
        if body.kind != "snapshot":
            raise Unsupported(f"sampling client kind {body.kind!r} (snapshots only)")
        name = body.path or f"sampler-{next(self._ids)}"
        future = _concurrent(tc.save_weights_for_sampler(name, ttl_seconds=body.ttl_seconds,
                                                         user_metadata=body.user_metadata))
        if body.sampling_session_seq_id is not None:  # save_weights_and_get_sampling_client: a session over it
            def session(saved: types.SaveWeightsForSamplerResponse) -> types.SaveWeightsForSamplerResponseInternal:
                client = self.service.create_sampling_client(model_path=saved.path).result()
                sid = f"sampling-{secrets.token_hex(6)}"
                with self._lock:
                    self._sampling[sid] = (client, client.get_base_model(), saved.path)
                return types.SaveWeightsForSamplerResponseInternal(path=saved.path, sampling_session_id=sid)

            future = _then(future, session)
        return self._future(future, "SaveWeightsForSampler", body.model_id)

    # ---- sampling ------------------------------------------------------------------------------

    async def _create_sampling_session(self, request: Request) -> Response:
        body: types.CreateSamplingSessionRequest = await self._body(request, types.CreateSamplingSessionRequest)
        if body.model_path is None:
            self._local_base(body.base_model or "")
        client = await anyio.to_thread.run_sync(
            lambda: self.service.create_sampling_client(model_path=body.model_path, base_model=body.base_model).result())
        sid = f"sampling-{secrets.token_hex(6)}"
        with self._lock:
            self._sampling[sid] = (client, client.get_base_model(), body.model_path)
        return JSONResponse(types.CreateSamplingSessionResponse(sampling_session_id=sid).model_dump(mode="json"))

    async def _sampler(self, request: Request) -> Response:
        sid = request.path_params["name"].split("/")[1]
        with self._lock:
            session = self._sampling.get(sid)
        if session is None:
            return JSONResponse({"detail": f"no sampler {sid!r}"}, status_code=404)
        reply = types.GetSamplerResponse(sampler_id=sid, base_model=session[1], model_path=session[2])
        return JSONResponse(reply.model_dump(mode="json", exclude_none=True))

    async def _asample(self, request: Request) -> Response:
        body: types.SampleRequest = await self._body(request, types.SampleRequest)
        if body.record_stability_info or body.target_prompt_logprobs is not None or body.prompt_alt_tokens_k:
            raise Unsupported("stability info, target prompt logprobs and prompt alternative tokens")
        if body.sampling_session_id is not None:
            with self._lock:
                session = self._sampling.get(body.sampling_session_id)
            if session is None:
                raise KeyError(f"no sampling session {body.sampling_session_id!r}")
            client = session[0]
        else:
            client = await anyio.to_thread.run_sync(lambda: self.service.create_sampling_client(
                model_path=body.model_path, base_model=body.base_model).result())
        future = _concurrent(client.sample(
            body.prompt, body.num_samples, body.sampling_params, include_prompt_logprobs=bool(body.prompt_logprobs),
            topk_prompt_logprobs=body.topk_prompt_logprobs, topk_sample_logprobs=body.topk_sample_logprobs,
            prompt_logprobs_last_n=body.prompt_logprobs_last_n))
        ids = [f"seq-{secrets.token_hex(6)}" for _ in range(body.num_samples)]
        return self._future(future, "Sample", sample_sequence_ids=ids)

    # ---- futures -------------------------------------------------------------------------------

    async def _retrieve(self, request: Request) -> Response:
        body: types.FutureRetrieveRequest = await self._body(request, types.FutureRetrieveRequest)
        with self._lock:
            entry = self._futures.get(body.request_id)
        if entry is None:
            return JSONResponse({"detail": f"no request {body.request_id!r} (unknown or expired)"}, status_code=404)
        future, kind = entry
        done, _ = await anyio.to_thread.run_sync(lambda: cf.wait([future], timeout=self.long_poll_s))
        if not done:
            return JSONResponse(types.TryAgainResponse(request_id=body.request_id, queue_state="active")
                                .model_dump(mode="json"))
        exc = future.exception()
        if exc is not None:
            category = types.RequestErrorCategory.User if _user_error(exc) else types.RequestErrorCategory.Server
            if category is types.RequestErrorCategory.Server:
                log.error("%s %s failed", kind, body.request_id, exc_info=exc)
            message = str(exc) if isinstance(exc, Unsupported) else f"{type(exc).__name__}: {exc}"
            return JSONResponse(types.RequestFailedResponse(error=message, category=category).model_dump(mode="json"))
        result = future.result()
        if isinstance(result, types.ForwardBackwardOutput):
            return Response(forward_backward_output_to_proto(result), media_type=PROTO)
        if isinstance(result, types.SampleResponse):
            return Response(sample_response_to_proto(result), media_type=PROTO)
        return JSONResponse(result.model_dump(mode="json", exclude_none=True))

    def close_sessions(self) -> None:
        """Mark every session finished (heartbeats then get 410, as from Tinker after a session ends)."""
        with self._lock:
            for sid in self._sessions:
                self._sessions[sid] = False


__all__ = ["CheckpointRegistry", "TinkerCounterpart", "bearer_guard", "Unsupported", "forward_backward_output_to_proto", "forward_backward_request_from_proto",
           "new_api_key", "sample_response_to_proto"]
