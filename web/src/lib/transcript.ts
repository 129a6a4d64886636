/** Conversation export/import: a small versioned JSON document, validated on the way in. */

export interface TurnStats {
  tokensPerSecond: number | null;
  promptTokens: number | null;
  completionTokens: number | null;
  expertHitPercent: number | null;
  ttftMs: number | null;
  queueWaitMs: number | null;
  finishReason: string | null;
}

export interface Message {
  role: "system" | "user" | "assistant";
  content: string;
  reasoning?: string;
  stats?: TurnStats;
  /** Error shown under an assistant turn that failed or was cut. */
  error?: string;
  /** Something the server did that the page worked around (e.g. malformed events skipped). */
  warning?: string;
}

export const FORMAT = "colibri.chat";
export const VERSION = 1;

export interface Transcript {
  format: typeof FORMAT;
  version: typeof VERSION;
  model: string | null;
  exported_at: string;
  messages: Message[];
}

export function exportTranscript(messages: Message[], model: string | null, now = new Date()): string {
  const doc: Transcript = {
    format: FORMAT,
    version: VERSION,
    model,
    exported_at: now.toISOString(),
    messages: messages.map((m) => {
      const out: Message = { role: m.role, content: m.content };
      if (m.reasoning) out.reasoning = m.reasoning;
      if (m.stats) out.stats = m.stats;
      if (m.error) out.error = m.error;
      if (m.warning) out.warning = m.warning;
      return out;
    }),
  };
  return JSON.stringify(doc, null, 2);
}

export class TranscriptError extends Error {}

const ROLES = new Set(["system", "user", "assistant"]);

/** Accepts our own export, or a bare OpenAI `messages` array / `{messages: [...]}` body. */
export function importTranscript(text: string): { model: string | null; messages: Message[] } {
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch {
    throw new TranscriptError("The file is not JSON.");
  }
  let list: unknown;
  let model: string | null = null;
  if (Array.isArray(doc)) list = doc;
  else if (doc !== null && typeof doc === "object") {
    const d = doc as Record<string, unknown>;
    if (d.format !== undefined && d.format !== FORMAT) {
      throw new TranscriptError(`Unknown format ${JSON.stringify(d.format)}; expected "${FORMAT}".`);
    }
    if (d.version !== undefined && d.version !== VERSION) {
      throw new TranscriptError(`Unsupported version ${JSON.stringify(d.version)}; this dashboard reads version ${VERSION}.`);
    }
    list = d.messages;
    if (typeof d.model === "string") model = d.model;
  }
  if (!Array.isArray(list)) throw new TranscriptError("The file has no `messages` array.");
  const messages = list.map((m, i): Message => {
    if (m === null || typeof m !== "object") throw new TranscriptError(`messages.${i} is not an object.`);
    const r = m as Record<string, unknown>;
    if (typeof r.role !== "string" || !ROLES.has(r.role)) {
      throw new TranscriptError(`messages.${i}.role must be system, user or assistant.`);
    }
    if (typeof r.content !== "string") throw new TranscriptError(`messages.${i}.content must be a string.`);
    const out: Message = { role: r.role as Message["role"], content: r.content };
    const reasoning = r.reasoning ?? r.reasoning_content;
    if (typeof reasoning === "string" && reasoning) out.reasoning = reasoning;
    if (r.stats && typeof r.stats === "object") out.stats = r.stats as TurnStats;
    if (typeof r.error === "string") out.error = r.error;
    if (typeof r.warning === "string") out.warning = r.warning;
    return out;
  });
  return { model, messages };
}

/** The messages a request carries: errors and stats stay in the page. */
export function toRequestMessages(messages: Message[]): { role: string; content: string }[] {
  return messages
    .filter((m) => !(m.role === "assistant" && m.content === "" && m.error))
    .map((m) => ({ role: m.role, content: m.content }));
}
