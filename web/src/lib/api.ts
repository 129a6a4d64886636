/**
 * The dashboard's only way to the server: a small OpenAI-API client. Every failure becomes
 * an ApiError whose message is the server's own text where it sent one, so the page can
 * show errors "as the server wrote them".
 */
import { readSSE } from "./sse";

export type ErrorKind = "http" | "network" | "malformed" | "aborted" | "truncated";

export class ApiError extends Error {
  readonly status: number | null;
  readonly kind: ErrorKind;
  readonly code: string | null;
  readonly param: string | null;
  readonly type: string | null;
  /** Seconds the server asked us to wait (Retry-After), when it said. */
  readonly retryAfter: number | null;

  constructor(
    message: string,
    opts: {
      status?: number | null;
      kind?: ErrorKind;
      code?: string | null;
      param?: string | null;
      type?: string | null;
      retryAfter?: number | null;
    } = {},
  ) {
    super(message);
    this.name = "ApiError";
    this.status = opts.status ?? null;
    this.kind = opts.kind ?? "http";
    this.code = opts.code ?? null;
    this.param = opts.param ?? null;
    this.type = opts.type ?? null;
    this.retryAfter = opts.retryAfter ?? null;
  }

  get unauthorized(): boolean {
    return this.status === 401;
  }

  /** 429 (queue full / timed out) and 503 (engine restarting) are worth retrying. */
  get retryable(): boolean {
    return this.status === 429 || (this.status === 503 && this.code !== "scheduler_closed");
  }
}

export interface Connection {
  /** The OpenAI base URL, normally `<origin>/v1`. */
  baseUrl: string;
  apiKey: string;
}

/** `/health`, `/experts`, `/profile` live next to `/v1`, not under it. */
export function serverRoot(baseUrl: string): string {
  return baseUrl.replace(/\/+$/, "").replace(/\/v1$/, "");
}

export function v1Url(conn: Connection, path: string): string {
  return conn.baseUrl.replace(/\/+$/, "") + path;
}

export function rootUrl(conn: Connection, path: string): string {
  return serverRoot(conn.baseUrl) + path;
}

export function authHeaders(conn: Connection): Record<string, string> {
  return conn.apiKey ? { Authorization: `Bearer ${conn.apiKey}` } : {};
}

/** Retry-After is delta-seconds or an HTTP date; null when absent or unreadable. */
export function retryAfterSeconds(value: string | null, now: number = Date.now()): number | null {
  if (value === null) return null;
  const text = value.trim();
  if (/^\d+$/.test(text)) return Number(text);
  const when = Date.parse(text);
  if (Number.isNaN(when)) return null;
  return Math.max(0, Math.ceil((when - now) / 1000));
}

interface Detail {
  loc?: unknown;
  msg?: unknown;
}

/** Read the error a server sent, in any of the envelopes colibri and its peers use. */
export function errorFromBody(status: number, text: string, retryAfter: number | null): ApiError {
  let body: unknown = null;
  try {
    body = JSON.parse(text);
  } catch {
    body = null;
  }
  const base = { status, retryAfter };
  if (body !== null && typeof body === "object") {
    const obj = body as Record<string, unknown>;
    const err = obj.error;
    if (err !== null && typeof err === "object") {
      // OpenAI {"error":{message,type,param,code}} and Anthropic {"type":"error","error":{type,message}}.
      const e = err as Record<string, unknown>;
      return new ApiError(typeof e.message === "string" ? e.message : `HTTP ${status}`, {
        ...base,
        code: typeof e.code === "string" ? e.code : null,
        param: typeof e.param === "string" ? e.param : null,
        type: typeof e.type === "string" ? e.type : null,
      });
    }
    if (typeof err === "string") return new ApiError(err, base);
    if (Array.isArray(obj.detail)) {
      // 422 validation: {"detail":[{"loc":["body","options"],"msg":"..."}]}.
      const parts = (obj.detail as Detail[]).map((d) => {
        const loc = Array.isArray(d.loc) ? d.loc.filter((x) => x !== "body").join(".") : "";
        const msg = typeof d.msg === "string" ? d.msg : JSON.stringify(d);
        return loc ? `${loc}: ${msg}` : msg;
      });
      const param = (obj.detail as Detail[])
        .map((d) => (Array.isArray(d.loc) ? d.loc.filter((x) => x !== "body").join(".") : ""))
        .find((x) => x !== "");
      return new ApiError(parts.join("; ") || `HTTP ${status}`, { ...base, param: param ?? null });
    }
    if (typeof obj.detail === "string") return new ApiError(obj.detail, base);
    if (typeof obj.message === "string") return new ApiError(obj.message, base);
  }
  const plain = text.trim().slice(0, 500);
  return new ApiError(plain || `HTTP ${status}`, base);
}

export async function errorFromResponse(res: Response): Promise<ApiError> {
  let text = "";
  try {
    text = await res.text();
  } catch {
    text = "";
  }
  const err = errorFromBody(res.status, text, retryAfterSeconds(res.headers.get("Retry-After")));
  if (err.message === `HTTP ${res.status}` && res.statusText) {
    return new ApiError(`HTTP ${res.status} ${res.statusText}`, err);
  }
  return err;
}

function isAbort(e: unknown): boolean {
  return e instanceof DOMException ? e.name === "AbortError" : (e as Error)?.name === "AbortError";
}

/** fetch, with network failures and aborts turned into ApiErrors. */
export async function call(url: string, init: RequestInit = {}): Promise<Response> {
  try {
    return await fetch(url, init);
  } catch (e) {
    if (isAbort(e)) throw new ApiError("Cancelled.", { kind: "aborted" });
    let where = url;
    try {
      where = new URL(url, globalThis.location?.href).origin;
    } catch {
      /* keep the raw url */
    }
    throw new ApiError(`Cannot reach the server at ${where}.`, { kind: "network" });
  }
}

export async function getJSON<T>(conn: Connection, url: string, signal?: AbortSignal): Promise<T> {
  const res = await call(url, { headers: authHeaders(conn), signal });
  if (!res.ok) throw await errorFromResponse(res);
  try {
    return (await res.json()) as T;
  } catch {
    throw new ApiError(`The server answered ${url} with something that is not JSON.`, {
      status: res.status,
      kind: "malformed",
    });
  }
}

export interface RetryNotice {
  attempt: number;
  seconds: number;
  error: ApiError;
}

export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(new ApiError("Cancelled.", { kind: "aborted" }));
      return;
    }
    const t = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(t);
      reject(new ApiError("Cancelled.", { kind: "aborted" }));
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** Retry 429 / 503 as the server's Retry-After says (1 s when it does not), a few times. */
export async function withRetry<T>(
  fn: () => Promise<T>,
  opts: {
    retries?: number;
    signal?: AbortSignal;
    onRetry?: (n: RetryNotice) => void;
    wait?: (ms: number, signal?: AbortSignal) => Promise<void>;
  } = {},
): Promise<T> {
  const retries = opts.retries ?? 5;
  const wait = opts.wait ?? sleep;
  for (let attempt = 1; ; attempt++) {
    try {
      return await fn();
    } catch (e) {
      if (!(e instanceof ApiError) || !e.retryable || attempt > retries) throw e;
      const seconds = Math.min(30, e.retryAfter ?? 1);
      opts.onRetry?.({ attempt, seconds, error: e });
      await wait(seconds * 1000, opts.signal);
    }
  }
}

// ---- models, health ----------------------------------------------------------------------

export interface ModelCard {
  id: string;
  capabilities?: string[];
  input_modalities?: string[];
}

export async function listModels(conn: Connection, signal?: AbortSignal): Promise<ModelCard[]> {
  const body = await getJSON<{ data?: unknown }>(conn, v1Url(conn, "/models"), signal);
  if (!Array.isArray(body.data)) {
    throw new ApiError("GET /v1/models did not answer a model list.", { kind: "malformed" });
  }
  return (body.data as ModelCard[]).filter((m) => typeof m?.id === "string");
}

export interface Scheduler {
  active: number | boolean;
  queued: number;
  capacity: number;
  max_queue?: number;
  admitted?: number;
  completed?: number;
  cancelled?: number;
  failed?: number;
  rejected?: number;
  timed_out?: number;
}

export interface Health {
  status: string;
  arch?: string;
  scheduler?: Scheduler;
  kv_slots?: number;
  tiers?: { vram: number; ram: number; disk: number; vram_gb?: number; ram_gb?: number };
  hwinfo?: {
    cores?: number;
    ram_total_gb?: number;
    ram_avail_gb?: number;
    gpus?: number;
    vram_total_gb?: number;
    cpu?: string;
    gpu?: string;
    backend?: string;
  };
  capabilities?: string[];
  engine?: { state?: string; restarts?: number; pid?: number | null; seeds?: boolean };
}

/** /health answers 503 with a body while the engine restarts: that is a reading, not a failure. */
export async function getHealth(conn: Connection, signal?: AbortSignal): Promise<Health> {
  const res = await call(rootUrl(conn, "/health"), { headers: authHeaders(conn), signal });
  if (res.status === 503 || res.ok) {
    try {
      const body = (await res.json()) as Health;
      if (typeof body?.status === "string") return body;
    } catch {
      /* fall through */
    }
    if (res.ok) throw new ApiError("GET /health did not answer JSON.", { kind: "malformed" });
  }
  throw await errorFromResponse(res);
}

// ---- chat streaming ------------------------------------------------------------------------

export interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens?: number;
}

export interface ColibriStats {
  stats?: {
    prompt_tokens?: number;
    completion_tokens?: number;
    tokens_per_second?: number;
    cache_hit_percent?: number;
    rss_gb?: number;
    length_limited?: boolean;
  };
  perf?: Record<string, number> | null;
  entropy?: number[] | null;
}

export type ChatEvent =
  | { type: "content"; text: string }
  | { type: "reasoning"; text: string }
  | { type: "finish"; reason: string }
  | { type: "usage"; usage: Usage }
  | { type: "colibri"; colibri: ColibriStats }
  | { type: "malformed"; raw: string };

export interface ChatRequest {
  model: string;
  messages: { role: string; content: string; reasoning_content?: string }[];
  temperature?: number;
  max_completion_tokens?: number;
  enable_thinking?: boolean;
  cache_slot?: number;
  seed?: number;
}

export interface StreamInfo {
  requestId: string | null;
  queueWaitMs: number | null;
}

/**
 * POST a streaming chat completion and hand each event to `onEvent`. Resolves when the server
 * sent `[DONE]`; rejects with kind "truncated" when the stream ends without it (colibri closes
 * the connection when a turn fails after the stream started), and with the server's error
 * when a chunk carries one.
 */
export async function streamChat(
  conn: Connection,
  req: ChatRequest,
  opts: { signal?: AbortSignal; onEvent: (e: ChatEvent) => void; onRetry?: (n: RetryNotice) => void },
): Promise<StreamInfo> {
  const body = JSON.stringify({ ...req, stream: true, stream_options: { include_usage: true } });
  const res = await withRetry(
    async () => {
      const r = await call(v1Url(conn, "/chat/completions"), {
        method: "POST",
        headers: { ...authHeaders(conn), "Content-Type": "application/json" },
        body,
        signal: opts.signal,
      });
      if (!r.ok) throw await errorFromResponse(r);
      return r;
    },
    { signal: opts.signal, onRetry: opts.onRetry },
  );
  const wait = res.headers.get("x-colibri-queue-wait-ms");
  const info: StreamInfo = {
    requestId: res.headers.get("x-request-id"),
    queueWaitMs: wait !== null && /^\d+$/.test(wait) ? Number(wait) : null,
  };
  if (!res.body) throw new ApiError("The server sent no stream body.", { kind: "malformed" });
  let done = false;
  const frames = readSSE(res.body);
  // A network read can hold thousands of frames; give the page a turn every few ms of parsing.
  let sliceStart = Date.now();
  try {
    for (;;) {
      if (Date.now() - sliceStart > 16) {
        await new Promise((r) => setTimeout(r, 0));
        sliceStart = Date.now();
      }
      const next = await frames.next();
      if (next.done) break;
      const data = next.value.data;
      if (data === "[DONE]") {
        done = true;
        break;
      }
      let chunk: Record<string, unknown>;
      try {
        const parsed: unknown = JSON.parse(data);
        if (parsed === null || typeof parsed !== "object") throw new Error("not an object");
        chunk = parsed as Record<string, unknown>;
      } catch {
        opts.onEvent({ type: "malformed", raw: data.slice(0, 200) });
        continue;
      }
      if (chunk.error !== undefined) throw errorFromBody(200, data, null);
      dispatchChunk(chunk, opts.onEvent);
    }
  } catch (e) {
    if (e instanceof ApiError) throw e;
    if (isAbort(e) || opts.signal?.aborted) throw new ApiError("Cancelled.", { kind: "aborted" });
    throw new ApiError("The connection to the server broke during the reply.", { kind: "truncated" });
  }
  if (!done) {
    if (opts.signal?.aborted) throw new ApiError("Cancelled.", { kind: "aborted" });
    throw new ApiError(
      "The reply ended before the server finished it (no [DONE]): the server closed the stream.",
      { kind: "truncated" },
    );
  }
  return info;
}

function dispatchChunk(chunk: Record<string, unknown>, onEvent: (e: ChatEvent) => void): void {
  const choices = Array.isArray(chunk.choices) ? chunk.choices : [];
  for (const choice of choices as Record<string, unknown>[]) {
    const delta = (choice?.delta ?? {}) as Record<string, unknown>;
    if (typeof delta.reasoning_content === "string" && delta.reasoning_content !== "") {
      onEvent({ type: "reasoning", text: delta.reasoning_content });
    }
    if (typeof delta.content === "string" && delta.content !== "") {
      onEvent({ type: "content", text: delta.content });
    }
    if (typeof choice?.finish_reason === "string") {
      onEvent({ type: "finish", reason: choice.finish_reason });
    }
  }
  const usage = chunk.usage as Usage | null | undefined;
  if (usage && typeof usage.completion_tokens === "number") onEvent({ type: "usage", usage });
  if (chunk.colibri && typeof chunk.colibri === "object") {
    onEvent({ type: "colibri", colibri: chunk.colibri as ColibriStats });
  }
}
