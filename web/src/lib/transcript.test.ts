import { describe, expect, it } from "vitest";
import { exportTranscript, importTranscript, type Message, toRequestMessages, TranscriptError } from "./transcript";

const msgs: Message[] = [
  { role: "user", content: "hi" },
  {
    role: "assistant",
    content: "hello",
    reasoning: "greet",
    stats: { tokensPerSecond: 5, promptTokens: 3, completionTokens: 2, expertHitPercent: 90, ttftMs: 10, queueWaitMs: 0, finishReason: "stop" },
  },
];

describe("transcript", () => {
  it("round-trips an export", () => {
    const text = exportTranscript(msgs, "glm-5.2-colibri", new Date("2026-01-01T00:00:00Z"));
    const doc = JSON.parse(text);
    expect(doc.format).toBe("colibri.chat");
    expect(doc.exported_at).toBe("2026-01-01T00:00:00.000Z");
    expect(importTranscript(text)).toEqual({ model: "glm-5.2-colibri", messages: msgs });
  });

  it("reads a bare OpenAI messages array with reasoning_content", () => {
    const r = importTranscript('[{"role":"user","content":"a"},{"role":"assistant","content":"b","reasoning_content":"r"}]');
    expect(r.messages[1]).toEqual({ role: "assistant", content: "b", reasoning: "r" });
  });

  it("names what is wrong with a bad file", () => {
    expect(() => importTranscript("nope")).toThrow("The file is not JSON.");
    expect(() => importTranscript('{"format":"other"}')).toThrow(TranscriptError);
    expect(() => importTranscript('{"messages":[{"role":"tool","content":"x"}]}')).toThrow("messages.0.role");
    expect(() => importTranscript('{"messages":[{"role":"user","content":3}]}')).toThrow("messages.0.content");
    expect(() => importTranscript('{"version":2,"messages":[]}')).toThrow("Unsupported version");
  });

  it("leaves failed empty replies and page-only fields out of requests", () => {
    const withError: Message[] = [...msgs, { role: "user", content: "q" }, { role: "assistant", content: "", error: "boom" }];
    expect(toRequestMessages(withError)).toEqual([
      { role: "user", content: "hi" },
      { role: "assistant", content: "hello" },
      { role: "user", content: "q" },
    ]);
  });
});
