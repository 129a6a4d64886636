import { afterEach, describe, expect, it, vi } from "vitest";
import {
  ApiError,
  type ChatEvent,
  errorFromBody,
  errorFromResponse,
  getHealth,
  listModels,
  retryAfterSeconds,
  rootUrl,
  serverRoot,
  streamChat,
  withRetry,
} from "./api";

const conn = { baseUrl: "http://h:8000/v1", apiKey: "k" };

function sse(frames: string[], status = 200, headers: Record<string, string> = {}): Response {
  const enc = new TextEncoder();
  const body = new ReadableStream<Uint8Array>({
    start(c) {
      for (const f of frames) c.enqueue(enc.encode(f));
      c.close();
    },
  });
  return new Response(body, { status, headers: { "Content-Type": "text/event-stream", ...headers } });
}

const chunk = (delta: object, extra: object = {}) =>
  `data: ${JSON.stringify({ choices: [{ index: 0, delta, finish_reason: null }], ...extra })}\n\n`;

afterEach(() => vi.unstubAllGlobals());

describe("endpoints", () => {
  it("resolves /health next to /v1, not under it", () => {
    expect(serverRoot("http://h:8000/v1")).toBe("http://h:8000");
    expect(serverRoot("http://h:8000/v1/")).toBe("http://h:8000");
    expect(rootUrl(conn, "/health")).toBe("http://h:8000/health");
  });
});

describe("errors", () => {
  it("reads the OpenAI envelope as the server wrote it", () => {
    const e = errorFromBody(
      400,
      '{"error":{"message":"`temperature` must be between 0 and 2.","type":"invalid_request_error","param":"temperature","code":null}}',
      null,
    );
    expect(e.message).toBe("`temperature` must be between 0 and 2.");
    expect(e.param).toBe("temperature");
    expect(e.type).toBe("invalid_request_error");
  });

  it("reads the Anthropic envelope", () => {
    const e = errorFromBody(401, '{"type":"error","error":{"type":"authentication_error","message":"Invalid or missing API key."}}', null);
    expect(e.message).toBe("Invalid or missing API key.");
    expect(e.unauthorized).toBe(true);
  });

  it("reads a 422 detail list and names the field", () => {
    const e = errorFromBody(422, '{"detail":[{"loc":["body","options"],"msg":"must not be empty","type":"value_error"}]}', null);
    expect(e.message).toBe("options: must not be empty");
    expect(e.param).toBe("options");
  });

  it("keeps a non-JSON body as text and falls back to the status line", async () => {
    expect(errorFromBody(502, "<html>Bad gateway</html>", null).message).toBe("<html>Bad gateway</html>");
    const r = await errorFromResponse(new Response("", { status: 500, statusText: "Internal Server Error" }));
    expect(r.message).toBe("HTTP 500 Internal Server Error");
  });

  it("parses Retry-After as seconds or a date", () => {
    expect(retryAfterSeconds("3")).toBe(3);
    expect(retryAfterSeconds(null)).toBeNull();
    expect(retryAfterSeconds("soon")).toBeNull();
    const now = Date.parse("2026-01-01T00:00:00Z");
    expect(retryAfterSeconds("Thu, 01 Jan 2026 00:00:05 GMT", now)).toBe(5);
  });

  it("retries 429 and 503 for as long as Retry-After says, not other errors", async () => {
    const waits: number[] = [];
    let n = 0;
    const out = await withRetry(
      async () => {
        n += 1;
        if (n === 1) throw new ApiError("The inference queue is full.", { status: 429, retryAfter: 2 });
        if (n === 2) throw new ApiError("restarting", { status: 503, code: "engine_unavailable" });
        return "ok";
      },
      { wait: async (ms) => void waits.push(ms) },
    );
    expect(out).toBe("ok");
    expect(waits).toEqual([2000, 1000]);
    await expect(
      withRetry(async () => {
        throw new ApiError("bad", { status: 400 });
      }),
    ).rejects.toThrow("bad");
    await expect(
      withRetry(
        async () => {
          throw new ApiError("closing", { status: 503, code: "scheduler_closed" });
        },
        { wait: async () => undefined },
      ),
    ).rejects.toThrow("closing");
  });

  it("gives up after the retry budget", async () => {
    let n = 0;
    await expect(
      withRetry(
        async () => {
          n += 1;
          throw new ApiError("full", { status: 429, retryAfter: 1 });
        },
        { retries: 2, wait: async () => undefined },
      ),
    ).rejects.toThrow("full");
    expect(n).toBe(3);
  });
});

describe("requests", () => {
  it("names an unreachable server instead of throwing a TypeError", async () => {
    vi.stubGlobal("fetch", vi.fn(async () => Promise.reject(new TypeError("Failed to fetch"))));
    const err = await listModels(conn).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ApiError);
    expect((err as ApiError).kind).toBe("network");
    expect((err as ApiError).message).toBe("Cannot reach the server at http://h:8000.");
  });

  it("sends the key as a bearer token", async () => {
    const f = vi.fn(async (_url: string, _init?: RequestInit) => Response.json({ data: [{ id: "m" }] }));
    vi.stubGlobal("fetch", f);
    expect(await listModels(conn)).toEqual([{ id: "m" }]);
    expect((f.mock.calls[0]?.[1]?.headers as Record<string, string>).Authorization).toBe("Bearer k");
  });

  it("reads a restarting engine's 503 /health as a reading", async () => {
    vi.stubGlobal("fetch", vi.fn(async () => Response.json({ status: "restarting" }, { status: 503 })));
    expect((await getHealth(conn)).status).toBe("restarting");
  });
});

describe("streamChat", () => {
  async function run(frames: string[]) {
    vi.stubGlobal("fetch", vi.fn(async () => sse(frames, 200, { "x-colibri-queue-wait-ms": "12" })));
    const events: ChatEvent[] = [];
    const result = await streamChat(conn, { model: "m", messages: [] }, { onEvent: (e) => events.push(e) })
      .then((info) => ({ info, error: null }))
      .catch((error: ApiError) => ({ info: null, error }));
    return { events, ...result };
  }

  it("splits reasoning from content and reads usage and the colibri frame", async () => {
    const { events, info, error } = await run([
      chunk({ role: "assistant", content: "" }),
      chunk({ reasoning_content: "think" }),
      chunk({ content: "Hel" }) + chunk({ content: "lo" }),
      `data: ${JSON.stringify({ choices: [{ index: 0, delta: {}, finish_reason: "stop" }] })}\n\n`,
      `data: ${JSON.stringify({ choices: [], usage: { prompt_tokens: 3, completion_tokens: 2, total_tokens: 5 } })}\n\n`,
      `data: ${JSON.stringify({ choices: [], colibri: { stats: { tokens_per_second: 9.5, cache_hit_percent: 50 } } })}\n\n`,
      "data: [DONE]\n\n",
    ]);
    expect(error).toBeNull();
    expect(info?.queueWaitMs).toBe(12);
    expect(events).toEqual([
      { type: "reasoning", text: "think" },
      { type: "content", text: "Hel" },
      { type: "content", text: "lo" },
      { type: "finish", reason: "stop" },
      { type: "usage", usage: { prompt_tokens: 3, completion_tokens: 2, total_tokens: 5 } },
      { type: "colibri", colibri: { stats: { tokens_per_second: 9.5, cache_hit_percent: 50 } } },
    ]);
  });

  it("reports a malformed event and keeps reading", async () => {
    const { events, error } = await run([chunk({ content: "a" }), "data: {not json\n\n", chunk({ content: "b" }), "data: [DONE]\n\n"]);
    expect(error).toBeNull();
    expect(events.map((e) => e.type)).toEqual(["content", "malformed", "content"]);
  });

  it("fails as truncated when the stream closes before [DONE]", async () => {
    const { events, error } = await run([chunk({ content: "partial" })]);
    expect(events).toEqual([{ type: "content", text: "partial" }]);
    expect(error?.kind).toBe("truncated");
  });

  it("surfaces an error object sent inside the stream", async () => {
    const { error } = await run([`data: {"error":{"message":"engine fell over","type":"server_error"}}\n\n`]);
    expect(error?.message).toBe("engine fell over");
  });

  it("retries a 429 before the stream starts and reports the wait", async () => {
    let n = 0;
    vi.stubGlobal(
      "fetch",
      vi.fn(async () => {
        n += 1;
        if (n === 1) {
          return Response.json(
            { error: { message: "The inference queue is full.", type: "rate_limit_error", code: "queue_full" } },
            { status: 429, headers: { "Retry-After": "0" } },
          );
        }
        return sse([chunk({ content: "x" }), "data: [DONE]\n\n"]);
      }),
    );
    const notices: number[] = [];
    const events: ChatEvent[] = [];
    await streamChat(conn, { model: "m", messages: [] }, {
      onEvent: (e) => events.push(e),
      onRetry: (r) => notices.push(r.seconds),
    });
    expect(notices).toEqual([0]);
    expect(events).toEqual([{ type: "content", text: "x" }]);
  });
});
