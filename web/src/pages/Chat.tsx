import { memo, useCallback, useEffect, useRef, useState } from "react";
import { LongText } from "../components/LongText";
import { ApiError, type ChatEvent, type ChatRequest, type ColibriStats, streamChat, type Usage } from "../lib/api";
import { type ChatExample, fetchExamples } from "../lib/examples";
import { exportTranscript, importTranscript, type Message, toRequestMessages, type TurnStats } from "../lib/transcript";
import { useSession } from "../session";

const MAX_TOKENS_LIMIT = 32768;

function fmt(v: number | null | undefined, digits = 1, unit = ""): string | null {
  return typeof v === "number" && Number.isFinite(v) ? `${v.toFixed(digits)}${unit}` : null;
}

function StatsLine({ s }: { s: TurnStats }) {
  const parts: [string, string | null][] = [
    ["tok/s", fmt(s.tokensPerSecond)],
    ["prompt", s.promptTokens !== null ? `${s.promptTokens} tok` : null],
    ["completion", s.completionTokens !== null ? `${s.completionTokens} tok` : null],
    ["expert hit", fmt(s.expertHitPercent, 1, "%")],
    ["first token", fmt(s.ttftMs, 0, " ms")],
    ["queue", fmt(s.queueWaitMs, 0, " ms")],
    ["finish", s.finishReason],
  ];
  return (
    <dl className="stats" data-testid="reply-stats">
      {parts
        .filter(([, v]) => v !== null)
        .map(([k, v]) => (
          <div key={k}>
            <dt>{k}</dt>
            <dd>{v}</dd>
          </div>
        ))}
    </dl>
  );
}

const MessageView = memo(function MessageView({ m, streaming }: { m: Message; streaming: boolean }) {
  return (
    <article className={`msg msg-${m.role}`} data-role={m.role} aria-busy={streaming || undefined}>
      <div className="msg-role">{m.role === "assistant" ? "colibri" : m.role}</div>
      {m.reasoning ? (
        <details className="reasoning" open={streaming && !m.content}>
          <summary>Reasoning ({m.reasoning.length.toLocaleString()} characters)</summary>
          <LongText text={m.reasoning} className="reasoning-text" />
        </details>
      ) : null}
      {m.content || !streaming ? (
        <LongText text={m.content} className="msg-content" />
      ) : (
        <div className="msg-content muted">{m.reasoning ? "" : "waiting for the first token…"}</div>
      )}
      {!streaming && !m.content && m.reasoning && !m.error && <p className="muted">(no answer text: the reply was reasoning only)</p>}
      {m.warning && <p className="warning">{m.warning}</p>}
      {m.error && (
        <p className={m.error === "Stopped." ? "muted" : "error"} role={m.error === "Stopped." ? undefined : "alert"} data-testid="reply-error">
          {m.error}
        </p>
      )}
      {m.stats && <StatsLine s={m.stats} />}
    </article>
  );
});

interface Live {
  content: string;
  reasoning: string;
  deltas: number;
  firstAt: number | null;
  usage: Usage | null;
  colibri: ColibriStats | null;
  finish: string | null;
  malformed: number;
}

function statsOf(live: Live, startedAt: number, queueWaitMs: number | null): TurnStats {
  const s = live.colibri?.stats;
  const now = performance.now();
  // Client-side decode rate as colibri's dashboard measures it, when the server sends none.
  const clientTps = live.firstAt !== null && live.deltas > 1 && now > live.firstAt ? (live.deltas - 1) / ((now - live.firstAt) / 1000) : null;
  return {
    tokensPerSecond: s?.tokens_per_second ?? clientTps,
    promptTokens: live.usage?.prompt_tokens ?? s?.prompt_tokens ?? null,
    completionTokens: live.usage?.completion_tokens ?? s?.completion_tokens ?? null,
    expertHitPercent: s?.cache_hit_percent ?? null,
    ttftMs: live.firstAt !== null ? live.firstAt - startedAt : null,
    queueWaitMs,
    finishReason: live.finish,
  };
}

export function Chat() {
  const session = useSession();
  const [messages, setMessages] = useState<Message[]>([]);
  const [input, setInput] = useState("");
  const [busy, setBusy] = useState(false);
  const [notice, setNotice] = useState<string | null>(null);
  const [temperature, setTemperature] = useState(0.7);
  const [maxTokens, setMaxTokens] = useState(1024);
  const [thinking, setThinking] = useState(true);
  const [slot, setSlot] = useState("auto");
  const [fileError, setFileError] = useState<string | null>(null);
  const ctl = useRef<AbortController | null>(null);
  const logRef = useRef<HTMLDivElement>(null);
  const stick = useRef(true);
  const fileRef = useRef<HTMLInputElement>(null);
  const kvSlots = session.health?.kv_slots;
  const [examples, setExamples] = useState<ChatExample[]>([]);

  useEffect(() => () => ctl.current?.abort(), []);

  // What the served model does well (its examples.json), offered while the chat is empty.
  useEffect(() => {
    const ctl = new AbortController();
    void fetchExamples(session.conn, ctl.signal).then((e) => {
      if (!ctl.signal.aborted) setExamples(e.chat);
    });
    return () => ctl.abort();
  }, [session.conn]);

  useEffect(() => {
    const el = logRef.current;
    if (el && stick.current) el.scrollTop = el.scrollHeight;
  }, [messages]);

  const send = useCallback(async (given?: string) => {
    const text = (given ?? input).trim();
    if (!text || busy || !session.model) return;
    const history: Message[] = [...messages, { role: "user", content: text }];
    setMessages([...history, { role: "assistant", content: "" }]);
    setInput("");
    setBusy(true);
    setNotice(null);
    stick.current = true;
    const controller = new AbortController();
    ctl.current = controller;
    const live: Live = { content: "", reasoning: "", deltas: 0, firstAt: null, usage: null, colibri: null, finish: null, malformed: 0 };
    const startedAt = performance.now();
    let queueWaitMs: number | null = null;
    let pending = false;
    let lastFlush = 0;
    const flush = (final: Partial<Message> = {}) => {
      pending = false;
      lastFlush = performance.now();
      const m: Message = { role: "assistant", content: live.content, ...final };
      if (live.reasoning) m.reasoning = live.reasoning;
      if (live.malformed) m.warning = `${live.malformed} malformed event${live.malformed > 1 ? "s" : ""} from the server ${live.malformed > 1 ? "were" : "was"} skipped.`;
      setMessages([...history, m]);
    };
    // Coalesce deltas into at most one render per frame; long replies flush less often.
    const schedule = () => {
      if (pending) return;
      pending = true;
      const gap = live.content.length > 200_000 ? 250 : 0;
      const wait = Math.max(0, gap - (performance.now() - lastFlush));
      setTimeout(() => requestAnimationFrame(() => pending && flush()), wait);
    };
    const onEvent = (e: ChatEvent) => {
      switch (e.type) {
        case "content":
        case "reasoning":
          if (live.firstAt === null) live.firstAt = performance.now();
          live.deltas += 1;
          if (e.type === "content") live.content += e.text;
          else live.reasoning += e.text;
          setNotice(null);
          schedule();
          break;
        case "finish":
          live.finish = e.reason;
          break;
        case "usage":
          live.usage = e.usage;
          break;
        case "colibri":
          live.colibri = e.colibri;
          break;
        case "malformed":
          live.malformed += 1;
          schedule();
          break;
      }
    };
    const req: ChatRequest = {
      model: session.model,
      messages: toRequestMessages(history),
      temperature,
      max_completion_tokens: maxTokens,
      enable_thinking: thinking,
    };
    // cache_slot only when the server advertises KV slots and the user picked one.
    if (typeof kvSlots === "number" && slot !== "auto") req.cache_slot = Number(slot);
    try {
      const info = await streamChat(session.conn, req, {
        signal: controller.signal,
        onEvent,
        onRetry: (r) =>
          setNotice(`${r.error.message} (HTTP ${r.error.status}) — retrying in ${r.seconds} s, attempt ${r.attempt}.`),
      });
      queueWaitMs = info.queueWaitMs;
      flush({ stats: statsOf(live, startedAt, queueWaitMs) });
    } catch (e) {
      const err = e instanceof ApiError ? e : new ApiError(String(e));
      session.reportError(err);
      const message = err.kind === "aborted" ? "Stopped." : err.message;
      flush({ error: message, stats: live.deltas ? statsOf(live, startedAt, queueWaitMs) : undefined });
    } finally {
      setNotice(null);
      setBusy(false);
      ctl.current = null;
    }
  }, [input, busy, messages, session, temperature, maxTokens, thinking, kvSlots, slot]);

  const stop = () => ctl.current?.abort();

  const doExport = () => {
    const blob = new Blob([exportTranscript(messages, session.model)], { type: "application/json" });
    const a = document.createElement("a");
    a.href = URL.createObjectURL(blob);
    a.download = `colibri-chat-${new Date().toISOString().replace(/[:.]/g, "-")}.json`;
    document.body.appendChild(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(a.href), 1000);
  };

  const doImport = async (file: File) => {
    setFileError(null);
    try {
      const { messages: imported } = importTranscript(await file.text());
      setMessages(imported);
    } catch (e) {
      setFileError(`Import failed: ${(e as Error).message}`);
    }
  };

  const ready = session.model !== null && session.state !== "unauthorized";
  return (
    <section className="chat" aria-labelledby="chat-title">
      <h1 id="chat-title" className="visually-hidden">Chat</h1>
      <div
        className="chat-log"
        ref={logRef}
        data-testid="chat-log"
        role="log"
        aria-live="polite"
        aria-label="Conversation"
        tabIndex={0}
        onScroll={(e) => {
          const el = e.currentTarget;
          stick.current = el.scrollHeight - el.scrollTop - el.clientHeight < 80;
        }}
      >
        {messages.length === 0 && (
          <div className="empty">
            <p>{ready ? `Ask ${session.model} something. Replies stream in; Stop cancels the request.` : "Not connected to a model yet — see the status bar."}</p>
            {ready && examples.length > 0 && (
              <div className="examples" data-testid="examples">
                <p className="muted">What this model does well — try one:</p>
                <ul>
                  {examples.map((e) => (
                    <li key={e.prompt}>
                      <button type="button" data-testid="example-prompt" disabled={busy} onClick={() => void send(e.prompt)}>
                        {e.prompt}
                      </button>
                      {e.skill && <span className="muted"> {e.skill}</span>}
                    </li>
                  ))}
                </ul>
              </div>
            )}
          </div>
        )}
        {messages.map((m, i) => (
          <MessageView key={i} m={m} streaming={busy && i === messages.length - 1} />
        ))}
      </div>
      {notice && (
        <p className="notice" role="status" data-testid="chat-notice">
          {notice}
        </p>
      )}
      {fileError && (
        <p className="error" role="alert">
          {fileError}
        </p>
      )}
      <form
        className="composer"
        onSubmit={(e) => {
          e.preventDefault();
          void send();
        }}
      >
        <label htmlFor="chat-input" className="visually-hidden">
          Message
        </label>
        <textarea
          id="chat-input"
          data-testid="chat-input"
          value={input}
          placeholder={ready ? "Message (Enter sends, Shift+Enter for a new line)" : "Waiting for a connection…"}
          rows={2}
          onChange={(e) => setInput(e.target.value)}
          onKeyDown={(e) => {
            if (e.key === "Enter" && !e.shiftKey && !e.nativeEvent.isComposing) {
              e.preventDefault();
              void send();
            }
          }}
        />
        {busy ? (
          <button type="button" className="danger" onClick={stop} data-testid="stop">
            Stop
          </button>
        ) : (
          <button type="submit" className="primary" disabled={!ready || !input.trim()} data-testid="send">
            Send
          </button>
        )}
      </form>
      <div className="chat-options">
        <label>
          Temperature
          <input type="number" min={0} max={2} step={0.1} value={temperature} onChange={(e) => setTemperature(Math.min(2, Math.max(0, Number(e.target.value) || 0)))} data-testid="temperature" />
        </label>
        <label>
          Max tokens
          <input type="number" min={1} max={MAX_TOKENS_LIMIT} step={1} value={maxTokens} onChange={(e) => setMaxTokens(Math.min(MAX_TOKENS_LIMIT, Math.max(1, Math.floor(Number(e.target.value) || 1))))} data-testid="max-tokens" />
        </label>
        <label className="check">
          <input type="checkbox" checked={thinking} onChange={(e) => setThinking(e.target.checked)} /> Reasoning
        </label>
        {typeof kvSlots === "number" && (
          <label>
            KV slot
            <select value={slot} onChange={(e) => setSlot(e.target.value)} data-testid="kv-slot">
              <option value="auto">auto</option>
              {Array.from({ length: kvSlots }, (_, i) => (
                <option key={i} value={String(i)}>
                  {i}
                </option>
              ))}
            </select>
          </label>
        )}
        <span className="spacer" />
        <button type="button" onClick={doExport} disabled={messages.length === 0 || busy} data-testid="export">
          Export
        </button>
        <button type="button" onClick={() => fileRef.current?.click()} disabled={busy}>
          Import
        </button>
        <input
          ref={fileRef}
          type="file"
          accept="application/json,.json"
          hidden
          aria-label="Import a conversation"
          data-testid="import-file"
          onChange={(e) => {
            const f = e.target.files?.[0];
            if (f) void doImport(f);
            e.target.value = "";
          }}
        />
        <button type="button" onClick={() => setMessages([])} disabled={messages.length === 0 || busy}>
          Clear
        </button>
      </div>
    </section>
  );
}
