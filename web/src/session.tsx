/**
 * The connection to one OpenAI-compatible server: base URL, key (memory only unless the user
 * asks to remember it), the chosen model, and `/health` polled every 5 s while the tab is
 * visible. Pages report their errors here so that a 401 anywhere brings up the key prompt.
 */
import { createContext, type ReactNode, useCallback, useContext, useEffect, useMemo, useRef, useState } from "react";
import { ApiError, type Connection, getHealth, type Health, listModels, type ModelCard } from "./lib/api";

export type ConnState = "connecting" | "connected" | "unauthorized" | "unreachable" | "restarting" | "error";

export interface Session {
  conn: Connection;
  model: string | null;
  models: ModelCard[];
  health: Health | null;
  /** false when the server has no /health (another OpenAI-compatible server). */
  hasHealth: boolean;
  state: ConnState;
  detail: string;
  reportError: (e: unknown) => void;
  setKey: (key: string, remember: boolean) => void;
  setBaseUrl: (url: string) => void;
  setModel: (id: string) => void;
  reprobe: () => void;
}

const SessionContext = createContext<Session | null>(null);

export function useSession(): Session {
  const s = useContext(SessionContext);
  if (!s) throw new Error("useSession outside SessionProvider");
  return s;
}

const KEY_STORE = "colibri.apiKey";
const URL_STORE = "colibri.baseUrl";
const MODEL_STORE = "colibri.model";
export const HEALTH_POLL_MS = 5000;

function read(key: string): string | null {
  try {
    return localStorage.getItem(key);
  } catch {
    return null;
  }
}

function write(key: string, value: string | null): void {
  try {
    if (value === null) localStorage.removeItem(key);
    else localStorage.setItem(key, value);
  } catch {
    /* storage may be disabled; nothing else depends on it */
  }
}

export function defaultBaseUrl(): string {
  const { origin, port } = window.location;
  // The Vite dev server is not the engine: point at the default colibri port instead.
  return port === "5173" ? "http://127.0.0.1:8000/v1" : `${origin}/v1`;
}

export function usePageVisible(): boolean {
  const [visible, setVisible] = useState(() => document.visibilityState !== "hidden");
  useEffect(() => {
    const on = () => setVisible(document.visibilityState !== "hidden");
    document.addEventListener("visibilitychange", on);
    return () => document.removeEventListener("visibilitychange", on);
  }, []);
  return visible;
}

export function SessionProvider({ children }: { children: ReactNode }) {
  const [baseUrl, setBaseUrlState] = useState(() => read(URL_STORE) ?? defaultBaseUrl());
  const [apiKey, setApiKey] = useState(() => read(KEY_STORE) ?? "");
  const [models, setModels] = useState<ModelCard[]>([]);
  const [model, setModelState] = useState<string | null>(null);
  const [health, setHealth] = useState<Health | null>(null);
  const [hasHealth, setHasHealth] = useState(true);
  const [state, setState] = useState<ConnState>("connecting");
  const [detail, setDetail] = useState("");
  const [probeTick, setProbeTick] = useState(0);
  const visible = usePageVisible();
  const conn = useMemo(() => ({ baseUrl, apiKey }), [baseUrl, apiKey]);
  const stateRef = useRef(state);
  stateRef.current = state;

  const reportError = useCallback((e: unknown) => {
    if (!(e instanceof ApiError)) return;
    if (e.unauthorized) {
      setState("unauthorized");
      setDetail(e.message);
    } else if (e.kind === "network") {
      setState("unreachable");
      setDetail(e.message);
    } else if (e.status === 503 && e.code === "engine_unavailable") {
      setState("restarting");
      setDetail(e.message);
    }
  }, []);

  const pollHealth = useCallback(
    async (signal?: AbortSignal) => {
      try {
        const h = await getHealth(conn, signal);
        setHealth(h);
        setHasHealth(true);
        if (h.status === "ok") {
          setState("connected");
          setDetail("");
        } else {
          setState("restarting");
          setDetail(`engine ${h.status}`);
        }
      } catch (e) {
        if (e instanceof ApiError && e.kind === "aborted") return;
        if (e instanceof ApiError && e.status === 404) {
          // Not colibri: a plain OpenAI-compatible server. Models answered, so we are connected.
          setHasHealth(false);
          setHealth(null);
          setState("connected");
          return;
        }
        reportError(e);
        if (e instanceof ApiError && e.kind !== "network" && !e.unauthorized) {
          setState("error");
          setDetail(e.message);
        }
      }
    },
    [conn, reportError],
  );

  // Probe: the model list first (it needs the key, so it tells us about auth), then /health.
  useEffect(() => {
    const ctl = new AbortController();
    setState((s) => (s === "unauthorized" ? s : "connecting"));
    (async () => {
      try {
        const list = await listModels(conn, ctl.signal);
        setModels(list);
        const saved = read(MODEL_STORE);
        setModelState((cur) => {
          const want = cur ?? saved;
          return list.find((m) => m.id === want)?.id ?? list[0]?.id ?? null;
        });
        await pollHealth(ctl.signal);
      } catch (e) {
        if (e instanceof ApiError && e.kind === "aborted") return;
        reportError(e);
        if (e instanceof ApiError && e.kind !== "network" && !e.unauthorized) {
          setState("error");
          setDetail(e.message);
        }
      }
    })();
    return () => ctl.abort();
  }, [conn, probeTick, pollHealth, reportError]);

  // Keep polling while the tab is visible; an unreachable server is re-probed from scratch.
  useEffect(() => {
    if (!visible || state === "unauthorized") return;
    const t = setInterval(() => {
      if (stateRef.current === "unreachable" || stateRef.current === "error") setProbeTick((n) => n + 1);
      else if (hasHealth) void pollHealth();
    }, HEALTH_POLL_MS);
    return () => clearInterval(t);
  }, [visible, state, hasHealth, pollHealth]);

  const session: Session = {
    conn,
    model,
    models,
    health,
    hasHealth,
    state,
    detail,
    reportError,
    setKey: (key, remember) => {
      write(KEY_STORE, remember ? key : null);
      setApiKey(key);
      setProbeTick((n) => n + 1);
    },
    setBaseUrl: (url) => {
      const clean = url.trim().replace(/\/+$/, "");
      write(URL_STORE, clean === defaultBaseUrl() ? null : clean);
      setBaseUrlState(clean);
    },
    setModel: (id) => {
      write(MODEL_STORE, id);
      setModelState(id);
    },
    reprobe: () => setProbeTick((n) => n + 1),
  };
  return <SessionContext.Provider value={session}>{children}</SessionContext.Provider>;
}

/** Run `fn` now and every `ms` while `enabled` and the tab is visible. */
export function usePoll(fn: (signal: AbortSignal) => Promise<void>, ms: number, enabled: boolean): void {
  const visible = usePageVisible();
  const fnRef = useRef(fn);
  fnRef.current = fn;
  useEffect(() => {
    if (!enabled || !visible) return;
    const ctl = new AbortController();
    let timer: ReturnType<typeof setTimeout> | undefined;
    let stopped = false;
    const tick = async () => {
      try {
        await fnRef.current(ctl.signal);
      } catch {
        /* the callback reports its own errors */
      }
      if (!stopped) timer = setTimeout(tick, ms);
    };
    void tick();
    return () => {
      stopped = true;
      ctl.abort();
      if (timer) clearTimeout(timer);
    };
  }, [ms, enabled, visible]);
}
