/**
 * Example prompts the served model ships (`GET /examples.json`, spec/http.md §10): the chat
 * prompts an empty conversation offers and the System One question the page starts with.
 * A model without examples (or a server that does not answer the path) offers none.
 */
import { type Connection, getJSON, rootUrl } from "./api";

export interface ChatExample {
  prompt: string;
  skill: string | null;
}

export interface SystemOneExample {
  state: string;
  question: string;
  options: string[];
}

export interface Examples {
  chat: ChatExample[];
  systemone: SystemOneExample | null;
}

export const NO_EXAMPLES: Examples = { chat: [], systemone: null };

const text = (v: unknown): v is string => typeof v === "string" && v.trim().length > 0;

/** Reads the served document, keeping only well-formed entries. */
export function parseExamples(doc: unknown): Examples {
  if (doc === null || typeof doc !== "object") return NO_EXAMPLES;
  const d = doc as Record<string, unknown>;
  const chat: ChatExample[] = [];
  for (const e of Array.isArray(d.chat) ? d.chat : []) {
    const r = e as Record<string, unknown> | null;
    if (r && text(r.prompt)) chat.push({ prompt: r.prompt, skill: text(r.skill) ? r.skill : null });
  }
  const s = d.systemone as Record<string, unknown> | null | undefined;
  let systemone: SystemOneExample | null = null;
  if (s && typeof s === "object" && text(s.question) && Array.isArray(s.options) && s.options.length >= 2 && s.options.every(text)) {
    systemone = { state: typeof s.state === "string" ? s.state : "", question: s.question, options: s.options as string[] };
  }
  return { chat, systemone };
}

/** The served examples; none when the request fails (an older server, another implementation). */
export async function fetchExamples(conn: Connection, signal?: AbortSignal): Promise<Examples> {
  try {
    return parseExamples(await getJSON<unknown>(conn, rootUrl(conn, "/examples.json"), signal));
  } catch {
    return NO_EXAMPLES;
  }
}
