/**
 * Incremental Server-Sent Events parser (the WHATWG event-stream grammar, reduced to
 * what OpenAI-compatible servers send): frames end at a blank line, `data:` lines of one
 * frame are joined with "\n", `event:` names the frame, lines starting with ":" are
 * comments (keepalives). Accepts LF, CRLF and CR line ends, split anywhere across chunks.
 */

export interface SSEFrame {
  event: string | null;
  data: string;
}

export class SSEParser {
  private buffer = "";
  private dataLines: string[] = [];
  private event: string | null = null;
  private sawCR = false;

  /** Feed decoded text; returns every frame completed by it. */
  push(text: string): SSEFrame[] {
    const frames: SSEFrame[] = [];
    let start = 0;
    for (let i = 0; i < text.length; i++) {
      const ch = text.charCodeAt(i);
      if (ch === 10 /* \n */ && this.sawCR) {
        // The LF of a CRLF pair: the line already ended at the CR.
        this.sawCR = false;
        start = i + 1;
        continue;
      }
      this.sawCR = false;
      if (ch === 10 || ch === 13) {
        this.buffer += text.slice(start, i);
        this.line(this.buffer, frames);
        this.buffer = "";
        start = i + 1;
        this.sawCR = ch === 13;
      }
    }
    this.buffer += text.slice(start);
    return frames;
  }

  /** End of stream: a frame not closed by a blank line is dropped, as the grammar says. */
  end(): { frames: SSEFrame[]; truncated: boolean } {
    const truncated = this.buffer.length > 0 || this.dataLines.length > 0;
    this.buffer = "";
    this.dataLines = [];
    this.event = null;
    return { frames: [], truncated };
  }

  private line(line: string, out: SSEFrame[]): void {
    if (line === "") {
      if (this.dataLines.length > 0) {
        out.push({ event: this.event, data: this.dataLines.join("\n") });
      }
      this.dataLines = [];
      this.event = null;
      return;
    }
    if (line.startsWith(":")) return;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "data") this.dataLines.push(value);
    else if (field === "event") this.event = value;
    // `id:` and `retry:` carry nothing an OpenAI stream uses.
  }
}

/** Read a byte stream as SSE frames; UTF-8 sequences split across chunks decode correctly. */
export async function* readSSE(
  body: ReadableStream<Uint8Array>,
): AsyncGenerator<SSEFrame, { truncated: boolean }> {
  const reader = body.getReader();
  const decoder = new TextDecoder("utf-8");
  const parser = new SSEParser();
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      for (const frame of parser.push(decoder.decode(value, { stream: true }))) yield frame;
    }
    for (const frame of parser.push(decoder.decode())) yield frame;
    return { truncated: parser.end().truncated };
  } finally {
    reader.releaseLock();
  }
}
