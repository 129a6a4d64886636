import { describe, expect, it } from "vitest";
import { readSSE, SSEParser } from "./sse";

function streamOf(chunks: (string | Uint8Array)[]): ReadableStream<Uint8Array> {
  const enc = new TextEncoder();
  return new ReadableStream({
    start(controller) {
      for (const c of chunks) controller.enqueue(typeof c === "string" ? enc.encode(c) : c);
      controller.close();
    },
  });
}

async function collect(chunks: (string | Uint8Array)[]) {
  const frames = [];
  const gen = readSSE(streamOf(chunks));
  for (;;) {
    const r = await gen.next();
    if (r.done) return { frames, truncated: r.value.truncated };
    frames.push(r.value);
  }
}

describe("SSEParser", () => {
  it("splits frames on blank lines and reads data lines", () => {
    const p = new SSEParser();
    expect(p.push('data: {"a":1}\n\ndata: [DONE]\n\n')).toEqual([
      { event: null, data: '{"a":1}' },
      { event: null, data: "[DONE]" },
    ]);
  });

  it("keeps a frame split at any byte across chunks", () => {
    const text = 'data: {"x":"hello"}\n\n';
    for (let cut = 0; cut <= text.length; cut++) {
      const p = new SSEParser();
      const frames = [...p.push(text.slice(0, cut)), ...p.push(text.slice(cut))];
      expect(frames).toEqual([{ event: null, data: '{"x":"hello"}' }]);
    }
  });

  it("accepts CRLF and CR line ends, including a CRLF split between chunks", () => {
    const p = new SSEParser();
    expect(p.push("data: a\r")).toEqual([]);
    expect(p.push("\n\r\ndata: b\r\r")).toEqual([
      { event: null, data: "a" },
      { event: null, data: "b" },
    ]);
  });

  it("joins multi-line data, reads event names, skips comments", () => {
    const p = new SSEParser();
    const frames = p.push(": keepalive\n\nevent: message_start\ndata: x\ndata:y\n\n");
    expect(frames).toEqual([{ event: "message_start", data: "x\ny" }]);
  });

  it("reports an unterminated last frame as truncated", () => {
    const p = new SSEParser();
    p.push("data: partial");
    expect(p.end().truncated).toBe(true);
    const q = new SSEParser();
    q.push("data: ok\n\n");
    expect(q.end().truncated).toBe(false);
  });
});

describe("readSSE", () => {
  it("decodes a UTF-8 character split across chunks", async () => {
    const bytes = new TextEncoder().encode('data: {"t":"丣"}\n\n');
    const cut = bytes.indexOf(0xe4) + 1;
    const { frames } = await collect([bytes.slice(0, cut), bytes.slice(cut)]);
    expect(frames[0]?.data).toBe('{"t":"丣"}');
  });

  it("says when the stream closed mid-frame", async () => {
    const r = await collect(['data: {"a":1}\n\n', 'data: {"b"']);
    expect(r.frames).toHaveLength(1);
    expect(r.truncated).toBe(true);
  });
});
