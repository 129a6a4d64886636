import { type MouseEvent, useCallback, useEffect, useRef, useState } from "react";
import { ApiError, getJSON, rootUrl } from "../lib/api";
import {
  type Atlas,
  type AtlasExpert,
  type AtlasState,
  atlasFailure,
  atlasState,
  layers as layerSummary,
  topAffinities,
  topics,
} from "../lib/atlas";
import {
  cellColour,
  decayFlash,
  decodeHits,
  decodeMap,
  type ExpertGrid,
  gridCell,
  type ExpertsBody,
  heatText,
  mapSignature,
  TIER_COLOURS,
  TIER_NAMES,
  tierName,
} from "../lib/experts";
import { usePoll, useSession } from "../session";

export const EXPERTS_POLL_MS = 1500;

type Live = { kind: "loading" } | { kind: "absent" } | { kind: "error"; message: string } | { kind: "ok"; body: ExpertsBody; grid: ExpertGrid };

/** Map a grid row to an absolute layer: the atlas's own layer list when it matches, else colibri's GLM-5.2 rule. */
function layerOf(row: number, rows: number, atlas: Atlas | null): number | null {
  if (atlas && atlas.layers.length === rows) return atlas.layers[row] ?? null;
  if (rows === 76) return row === 75 ? 78 : row + 3;
  return null;
}

function depthRole(row: number, rows: number): string {
  const f = rows > 1 ? row / (rows - 1) : 0;
  if (f < 0.2) return "early layer: token identity and script";
  if (f < 0.45) return "lower-middle layer: syntax and local structure";
  if (f < 0.7) return "middle layer: topic and meaning";
  if (f < 0.9) return "upper layer: task and answer shape";
  return "last layers: next-token choice";
}

function LiveGrid({ live, atlas }: { live: Extract<Live, { kind: "ok" }>; atlas: Atlas | null }) {
  const canvas = useRef<HTMLCanvasElement>(null);
  const wrap = useRef<HTMLDivElement>(null);
  const flash = useRef<Float32Array>(new Float32Array(0));
  const lastSeq = useRef<number | null>(null);
  const raf = useRef<number | null>(null);
  const [width, setWidth] = useState(600);
  const [hover, setHover] = useState<{ x: number; y: number; text: string[] } | null>(null);
  const { grid, body } = live;
  const cell = gridCell(width, grid.cols);
  const gap = cell >= 8 ? 1 : 0;

  useEffect(() => {
    const el = wrap.current;
    if (!el) return;
    const ro = new ResizeObserver(() => setWidth(el.clientWidth));
    ro.observe(el);
    setWidth(el.clientWidth);
    return () => ro.disconnect();
  }, []);

  const draw = useCallback(() => {
    const c = canvas.current;
    const ctx = c?.getContext("2d");
    if (!c || !ctx) return;
    const dpr = window.devicePixelRatio || 1;
    const w = grid.cols * cell;
    const h = grid.rows * cell;
    if (c.width !== Math.round(w * dpr) || c.height !== Math.round(h * dpr)) {
      c.width = Math.round(w * dpr);
      c.height = Math.round(h * dpr);
      c.style.width = `${w}px`;
      c.style.height = `${h}px`;
    }
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, w, h);
    const fl = flash.current;
    for (let r = 0; r < grid.rows; r++) {
      for (let col = 0; col < grid.cols; col++) {
        const i = r * grid.cols + col;
        const [R, G, B] = cellColour(grid.tier[i]!, grid.heat[i]!, fl[i] ?? 0);
        ctx.fillStyle = `rgb(${R},${G},${B})`;
        ctx.fillRect(col * cell, r * cell, cell - gap, cell - gap);
      }
    }
    c.dataset.cellsDrawn = String(grid.rows * grid.cols);
  }, [grid, cell, gap]);

  // A new seq flashes the experts routed in the last turn; the flash decays ×0.94 a frame.
  useEffect(() => {
    const n = grid.rows * grid.cols;
    if (flash.current.length !== n) flash.current = new Float32Array(n);
    if (lastSeq.current !== null && body.seq !== lastSeq.current) {
      for (const i of decodeHits(body.hits, n)) flash.current[i] = 1;
    }
    lastSeq.current = body.seq;
    const frame = () => {
      draw();
      raf.current = decayFlash(flash.current) ? requestAnimationFrame(frame) : null;
    };
    if (raf.current !== null) cancelAnimationFrame(raf.current);
    frame();
    return () => {
      if (raf.current !== null) cancelAnimationFrame(raf.current);
      raf.current = null;
    };
  }, [body, grid, draw]);

  const onMove = (e: MouseEvent<HTMLCanvasElement>) => {
    const rect = e.currentTarget.getBoundingClientRect();
    const col = Math.floor((e.clientX - rect.left) / cell);
    const row = Math.floor((e.clientY - rect.top) / cell);
    if (row < 0 || col < 0 || row >= grid.rows || col >= grid.cols) {
      setHover(null);
      return;
    }
    const i = row * grid.cols + col;
    const layer = layerOf(row, grid.rows, atlas);
    const lines = [
      `${layer !== null ? `layer ${layer}` : `sparse layer row ${row}`} · expert ${col}`,
      `tier ${tierName(grid.tier[i]!)} · heat ${grid.heat[i]} (${heatText(grid.heat[i]!)})`,
    ];
    const entry: AtlasExpert | undefined = layer !== null ? atlas?.experts.find((x) => x.layer === layer && x.expert === col) : undefined;
    if (entry) {
      lines.push(
        `${entry.specialist ? `specialist: ${entry.top}` : "generalist"} · ` +
          topAffinities(entry)
            .map(([c, p]) => `${c} ${p}%`)
            .join(", "),
      );
    } else {
      lines.push(depthRole(row, grid.rows));
    }
    setHover({ x: e.clientX - rect.left + cell, y: e.clientY - rect.top + cell, text: lines });
  };

  const counts = [0, 0, 0];
  for (const t of grid.tier) counts[t] = (counts[t] ?? 0) + 1;
  const hits = decodeHits(body.hits, grid.rows * grid.cols).length;
  return (
    <div>
      <p className="muted" data-testid="brain-summary">
        {grid.rows} sparse layers × {grid.cols} experts = {grid.rows * grid.cols} experts · seq {body.seq} · {hits} routed in the last step
      </p>
      <div className="grid-wrap" ref={wrap}>
        <canvas
          ref={canvas}
          data-testid="brain-grid"
          data-rows={grid.rows}
          data-cols={grid.cols}
          data-cell={cell}
          data-seq={body.seq}
          data-signature={mapSignature(body)}
          role="img"
          aria-label={`Expert routing map: ${grid.rows} layers by ${grid.cols} experts; ${counts[2]} in VRAM, ${counts[1]} in RAM, ${counts[0]} on disk.`}
          onMouseMove={onMove}
          onMouseLeave={() => setHover(null)}
        />
        {hover && (
          <div className="tooltip" style={{ left: hover.x, top: hover.y }} data-testid="brain-tooltip" role="tooltip">
            {hover.text.map((t) => (
              <div key={t}>{t}</div>
            ))}
          </div>
        )}
      </div>
      <ul className="legend">
        {TIER_NAMES.map((name, t) => (
          <li key={name}>
            <span className="swatch" style={{ background: `rgb(${TIER_COLOURS[t]!.join(",")})` }} aria-hidden="true" /> {name} ({counts[t]})
          </li>
        ))}
        <li>brightness = routing heat · white flash = routed in the last turn</li>
      </ul>
    </div>
  );
}

/** The two commands that write the atlas this server serves, in full. */
function AtlasCommands() {
  return (
    <>
      <code>colibri atlas sweep --model DIR --out atlas</code> runs the probes through the model in <code>DIR</code> (without{" "}
      <code>--model</code>, the default model), then <code>colibri atlas analyze --stats atlas/stats --web</code> writes the file this server
      serves as <code>/experts.json</code>
    </>
  );
}

function Explore({ state }: { state: AtlasState }) {
  if (state.kind === "loading") return <p className="muted">Loading the atlas…</p>;
  if (state.kind === "absent")
    return (
      <div className="empty-state" data-testid="atlas-empty" role="status">
        <h2>No expert atlas on this server</h2>
        <p>{state.why}</p>
        <p>
          The atlas is the output of colibri’s atlas analysis in its dashboard format: routing statistics per topic, base-rate
          corrected, with a replication gate. <AtlasCommands />; reload and this view shows the regions, the specialists per topic and
          the specialisation per layer.
        </p>
      </div>
    );
  if (state.kind === "error")
    return (
      <p className="error" role="alert">
        experts.json is there but unreadable: {state.message}
      </p>
    );
  const { atlas } = state;
  const tops = topics(atlas);
  const per = layerSummary(atlas);
  const specialists = atlas.experts.filter((e) => e.specialist).length;
  const maxSpec = Math.max(0.01, ...per.map((l) => l.meanSpec));
  return (
    <div data-testid="atlas">
      <p className="muted">
        {atlas.experts.length} characterised experts, {specialists} specialists, {atlas.categories.length} topics, {atlas.layers.length} layers.
      </p>
      <h2>Regions</h2>
      <div className="regions">
        {tops.map((t) => (
          <div className="region" key={t.topic}>
            <h3>{t.topic}</h3>
            <p className="muted">{t.owned} experts lean here</p>
            {t.specialists.length === 0 ? (
              <p className="muted">no specialists</p>
            ) : (
              <ol>
                {t.specialists.map((e) => (
                  <li key={`${e.layer}:${e.expert}`}>
                    L{e.layer} · E{e.expert} <span className="muted">spec {e.spec.toFixed(2)}</span>
                  </li>
                ))}
              </ol>
            )}
          </div>
        ))}
      </div>
      <h2>Specialisation by layer</h2>
      <svg className="chart" viewBox={`0 0 ${Math.max(1, per.length) * 10} 100`} preserveAspectRatio="none" role="img" aria-label="Mean specialisation per layer">
        {per.map((l, i) => (
          <rect key={l.layer} x={i * 10 + 1} width={8} y={100 - (l.meanSpec / maxSpec) * 100} height={(l.meanSpec / maxSpec) * 100} className="bar-fill">
            <title>{`layer ${l.layer}: mean spec ${l.meanSpec.toFixed(3)}, ${l.specialists}/${l.experts} specialists`}</title>
          </rect>
        ))}
      </svg>
      <p className="muted">
        Layers {atlas.layers[0]} to {atlas.layers[atlas.layers.length - 1]}, left to right; bar height = mean specialisation (1 − H/log C) of the
        layer’s characterised experts. Hover a bar for its numbers.
      </p>
      <p className="muted" data-testid="atlas-command">
        This is the atlas written for the served model, or the one the model ships. To make your own: <AtlasCommands />, and reload.
      </p>
    </div>
  );
}

export function Brain() {
  const session = useSession();
  const [view, setView] = useState<"live" | "explore">("live");
  const [live, setLive] = useState<Live>({ kind: "loading" });
  const [atlas, setAtlas] = useState<AtlasState>({ kind: "loading" });

  usePoll(
    async (signal) => {
      try {
        const body = await getJSON<ExpertsBody>(session.conn, rootUrl(session.conn, "/experts"), signal);
        setLive({ kind: "ok", body, grid: decodeMap(body) });
      } catch (e) {
        if (e instanceof ApiError && e.kind === "aborted") return;
        if (e instanceof ApiError && e.status === 404) setLive({ kind: "absent" });
        else {
          session.reportError(e);
          setLive({ kind: "error", message: (e as Error).message });
        }
      }
    },
    EXPERTS_POLL_MS,
    session.state !== "unauthorized",
  );

  // The atlas is a static file, read once; colibri answers an empty state while none was
  // written, so a fresh install's dashboard logs no failed request.
  useEffect(() => {
    const ctl = new AbortController();
    getJSON<unknown>(session.conn, rootUrl(session.conn, "/experts.json"), ctl.signal)
      .then((doc) => setAtlas(atlasState(doc)))
      .catch((e: unknown) => {
        const state = atlasFailure(e);
        if (state) setAtlas(state);
      });
    return () => ctl.abort();
  }, [session.conn]);

  return (
    <section aria-labelledby="brain-title">
      <h1 id="brain-title">Brain</h1>
      <div className="tabs" role="tablist" aria-label="Brain views">
        <button type="button" role="tab" id="tab-live" aria-controls="panel-brain" aria-selected={view === "live"} onClick={() => setView("live")}>
          Live routing
        </button>
        <button type="button" role="tab" id="tab-explore" aria-controls="panel-brain" aria-selected={view === "explore"} onClick={() => setView("explore")} data-testid="tab-explore">
          Explore
        </button>
      </div>
      <div role="tabpanel" id="panel-brain" aria-labelledby={view === "live" ? "tab-live" : "tab-explore"}>
        {view === "live" &&
          (live.kind === "loading" ? (
            <p className="muted">Reading /experts…</p>
          ) : live.kind === "absent" ? (
            <div className="empty-state" role="status" data-testid="experts-absent">
              <h2>Not available on this server</h2>
              <p>
                <code>GET /experts</code> answered 404: this server does not publish colibri’s live routing map.
              </p>
            </div>
          ) : live.kind === "error" ? (
            <p className="error" role="alert">
              {live.message}
            </p>
          ) : live.grid.rows * live.grid.cols === 0 ? (
            <div className="empty-state" role="status" data-testid="experts-empty">
              <h2>No routing map yet</h2>
              <p>The engine has not reported an expert map (or this session is not authenticated).</p>
            </div>
          ) : (
            <LiveGrid live={live} atlas={atlas.kind === "ok" ? atlas.atlas : null} />
          ))}
        {view === "explore" && <Explore state={atlas} />}
      </div>
    </section>
  );
}
