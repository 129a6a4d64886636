"""What every endpoint shares: configuration, the engine supervisor, admission, metrics,
and the per-request exchange the HTTP layer implements."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from colibri.server.affinity import AffinityTable
from colibri.server.affinity import conversation_slot as conversation_slot  # the endpoints' name
from colibri.server.chat_family import GLM, ChatFamily
from colibri.server.errors import ClientCancelled
from colibri.server.metrics import GenerationMetrics
from colibri.server.replica_layout import ReplicaLayout, SlotClaim
from colibri.server.replicas import ReplicaSet
from colibri.server.scheduler import Admission, Scheduler
from colibri.server.supervisor import EngineSupervisor

JSON = dict[str, Any]

DEFAULT_CORS_ORIGINS: tuple[str, ...] = (
    "http://127.0.0.1:8000", "http://localhost:8000", "http://127.0.0.1:5173",
    "http://localhost:5173", "http://tauri.localhost", "tauri://localhost")


@dataclass
class ServerConfig:
    model_id: str = "glm-5.2-colibri"
    api_key: str | None = None
    max_tokens: int = 1024
    kv_slots: int = 1
    #: Engine replicas behind this gateway (``--replicas``), each with ``kv_slots`` slots.
    replicas: int = 1
    max_queue: int = 8
    queue_timeout: float = 300.0
    cors_origins: tuple[str, ...] = DEFAULT_CORS_ORIGINS
    allowed_hosts: tuple[str, ...] = ()
    bind_host: str = "127.0.0.1"
    keepalive_s: float = 10.0
    #: What a keepalive chunk carries: "" (invisible), or "." with COLI_VISIBLE_KEEPALIVE=1.
    keepalive_text: str = ""
    think_default: bool = False
    web_dist: str | None = None
    #: The expert atlas served as /experts.json (None: $COLI_ATLAS or the state default).
    atlas_path: str | None = None
    #: The served model's tokenizer.json, for /v1/messages/count_tokens (None: not known).
    tokenizer_path: str | None = None
    #: The served model's folder: its examples.json and shipped atlas (None: not known).
    model_dir: str | None = None
    max_connections: int = 64
    max_connections_per_ip: int = 8
    read_deadline_s: float = 30.0
    #: The served model's chat template and per-family rules (server/chat_family.py).
    family: ChatFamily = GLM


class Exchange(Protocol):
    """One HTTP request as the endpoint logic sees it."""

    #: Set once the client has left (its connection closed); awaited by a running turn.
    gone: asyncio.Event
    last_write: float
    streaming: bool

    async def send_json(self, status: int, body: JSON,
                        headers: dict[str, str] | None = None) -> None: ...

    async def start_sse(self, headers: dict[str, str]) -> None: ...

    async def send_sse(self, data: bytes) -> None: ...


@dataclass
class ServerState:
    config: ServerConfig
    #: The one engine's supervisor, or the replica set with ``--replicas`` above 1.
    supervisor: EngineSupervisor | ReplicaSet
    metrics: GenerationMetrics = field(default_factory=GenerationMetrics)
    created: int = field(default_factory=lambda: int(time.time()))
    scheduler: Scheduler = field(init=False)
    #: Which replica holds each conversation's prefix (consulted with more than one replica).
    affinity: AffinityTable = field(default_factory=AffinityTable)

    def __post_init__(self) -> None:
        layout = (self.supervisor.layout if isinstance(self.supervisor, ReplicaSet)
                  else ReplicaLayout(1, self.config.kv_slots))
        self.scheduler = Scheduler(layout.capacity, self.config.max_queue,
                                   self.config.queue_timeout, self.metrics, layout)

    @property
    def replicated(self) -> bool:
        return self.scheduler.layout.replicas > 1

    @contextlib.asynccontextmanager
    async def admitted(self, slot: int | None, exchange: Exchange,
                       conversation: str | None = None) -> AsyncIterator[Admission]:
        """Hold a KV slot for the body; the outcome counter follows how the body ended.
        ``slot`` is the engine slot the request names (None: any); with several replicas,
        ``conversation`` (its :func:`conversation_key`) sends it to the replica holding its
        prefix while that one is ready, else to the least busy one."""
        wanted = None
        if self.replicated and conversation is not None:
            wanted = self.affinity.replica_for(conversation)
        admission = await self.scheduler.acquire(SlotClaim(wanted, slot), exchange.gone.is_set)
        if self.replicated and conversation is not None:
            self.affinity.served(conversation, wanted,
                                 self.scheduler.layout.replica_of(admission.slot))
        outcome = "failed"
        try:
            yield admission
            outcome = "completed"
        except ClientCancelled:
            outcome = "cancelled"
            raise
        finally:
            if outcome == "failed" and exchange.gone.is_set():
                outcome = "cancelled"
            self.scheduler.release(admission, outcome)


def wait_header(admission: Admission) -> dict[str, str]:
    return {"x-colibri-queue-wait-ms": str(round(admission.wait_s * 1000))}


def dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
